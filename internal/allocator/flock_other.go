//go:build !unix

package allocator

import "os"

// tryLockShared always succeeds where flock does not exist; bolt.Open
// still locks the file its own way.
func tryLockShared(*os.File) (unlock func(), ok bool) { return func() {}, true }
