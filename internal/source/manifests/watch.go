package manifests

import (
	"io/fs"
	"log/slog"
	"os"

	"github.com/fsnotify/fsnotify"
)

// dirWatch is the watch on the manifest directory, re-established when
// the directory is replaced or reappears, and whether the directory could
// be read the last time it was.
type dirWatch struct {
	path string
	log  *slog.Logger
	w    *fsnotify.Watcher // nil when not running (tests and benchmarks rescan directly)
	on   bool              // a watch is set on the directory info names
	info fs.FileInfo
	// unreadable is set while the directory cannot be read (the last
	// state stays in force; logged once).
	unreadable bool
}

// ensure (re)establishes the watch on the directory, also when the
// directory was replaced by another one of the same name. It reports
// whether a new watch was set up.
func (d *dirWatch) ensure() bool {
	if d.w == nil {
		return false
	}
	fi, err := os.Stat(d.path)
	if err != nil {
		d.on = false
		return false
	}
	if d.on && d.info != nil && os.SameFile(fi, d.info) {
		return false
	}
	_ = d.w.Remove(d.path) // the old watch may be gone already
	if err := d.w.Add(d.path); err != nil {
		d.log.Warn("cannot watch directory; relying on periodic re-reads", "err", err)
		d.on = false
		return false
	}
	d.on, d.info = true, fi
	return true
}
