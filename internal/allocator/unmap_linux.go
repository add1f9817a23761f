//go:build linux

package allocator

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// unmapLeaked unmaps every mapping of f's file in this process. A panic
// inside bolt.Open leaves its memory mapping of the file behind, and with
// it the file's flock: without this, opening the file again in the same
// process (a second attempt, a test) would wait for a lock nobody holds.
// Nothing references the mapping after the panic was recovered.
func unmapLeaked(f *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	dev := fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
	ino := strconv.FormatUint(st.Ino, 10)
	maps, err := os.Open("/proc/self/maps")
	if err != nil {
		return err
	}
	defer maps.Close()
	type region struct{ start, end uintptr }
	var leaked []region
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// address perms offset dev inode [path]
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 || fs[3] != dev || fs[4] != ino {
			continue
		}
		lo, hi, ok := strings.Cut(fs[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if ok && err1 == nil && err2 == nil {
			leaked = append(leaked, region{uintptr(a), uintptr(b)})
		}
	}
	for _, r := range leaked {
		if _, _, e := unix.Syscall(unix.SYS_MUNMAP, r.start, r.end-r.start, 0); e != 0 {
			return e
		}
	}
	return sc.Err()
}
