package main

import (
	"context"
	"log/slog"
)

// logAt logs from a file --vmodule=logging_test=4 does not match.
func logAt(log *slog.Logger, level slog.Level, msg string) {
	log.Log(context.Background(), level, msg)
}
