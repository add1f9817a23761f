//go:build !linux

package userspace

// osGuard returns the system's Guard: none off Linux.
func osGuard() Guard { return NoGuard{Reason: "guarding VIP addresses needs Linux nftables"} }

const guardTableName = "vipproxy-guard"
