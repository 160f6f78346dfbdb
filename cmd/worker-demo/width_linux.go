package main

import (
	"os"
	"syscall"
	"unsafe"
)

// terminalWidth asks the terminal behind f for its width (TIOCGWINSZ); 0
// when f is nil or not a terminal.
func terminalWidth(f *os.File) int {
	if f == nil {
		return 0
	}
	var size struct{ rows, cols, xpixels, ypixels uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&size)))
	if errno != 0 {
		return 0
	}
	return int(size.cols)
}
