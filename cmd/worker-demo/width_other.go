//go:build !linux

package main

import "os"

// terminalWidth is 0 (unknown) here: the demo draws at COLUMNS, or 80.
func terminalWidth(*os.File) int { return 0 }
