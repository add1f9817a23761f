package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// coldStartMemLimit is the soft memory limit of a cold start: a quarter of
// the memory this process may use (the cgroup v2 limit when one is set,
// else the machine's), at least 1 GiB. The collector runs rarely below it.
func coldStartMemLimit() int64 {
	avail := memTotal()
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 && (avail == 0 || n < avail) {
			avail = n
		}
	}
	return max(avail/4, 1<<30)
}

// memTotal is MemTotal of /proc/meminfo in bytes, 0 when unknown.
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
