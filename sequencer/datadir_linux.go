package sequencer

import (
	"bufio"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// flockHolder is the process that holds a flock on the file of fi, from
// /proc/locks, or 0 when that is not known. /proc/locks names the file by
// its device, major:minor in hex, and inode; some file systems (btrfs,
// overlayfs) give stat another device than the lock's, so the inode alone
// is taken too, when one process only holds a flock on it.
func flockHolder(fi fs.FileInfo) int {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer f.Close()
	dev := uint64(st.Dev)
	major := (dev>>8)&0xfff | (dev>>32)&^0xfff
	minor := dev&0xff | (dev>>12)&^0xff
	ino := strconv.FormatUint(uint64(st.Ino), 10)
	sameDev, sameIno := 0, map[int]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 22120 fe:00:9977924 0 EOF"; a waiter's
		// line has "->" after the number.
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" {
			continue
		}
		pid, err := strconv.Atoi(fields[4])
		if err != nil || pid <= 0 {
			continue
		}
		parts := strings.Split(fields[5], ":")
		if len(parts) != 3 || parts[2] != ino {
			continue
		}
		sameIno[pid] = true
		maj, err1 := strconv.ParseUint(parts[0], 16, 64)
		mnr, err2 := strconv.ParseUint(parts[1], 16, 64)
		if err1 == nil && err2 == nil && maj == major && mnr == minor {
			sameDev = pid
		}
	}
	if sameDev > 0 {
		return sameDev
	}
	if len(sameIno) == 1 {
		for pid := range sameIno {
			return pid
		}
	}
	return 0
}
