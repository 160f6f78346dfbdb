package scheduler

import "embed"

// scriptFiles holds the scheduler's own Redis scripts as Redis runs them; their
// sources are lua/*.lua beside this file (see internal/luagen).
//
//go:embed lua/assembled/*.lua
var scriptFiles embed.FS
