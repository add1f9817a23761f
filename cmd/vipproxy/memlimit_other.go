//go:build !linux

package main

// coldStartMemLimit is the soft memory limit of a cold start.
func coldStartMemLimit() int64 { return 1 << 30 }
