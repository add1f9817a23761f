//go:build linux

package e2e

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Sink is a TCP server for connection-rate loads: in one namespace, on one
// port, it accepts and closes at once, on a thread of its own in blocking
// system calls (no Go poller, no goroutine per connection), so that a load
// measures the proxy and the kernel rather than the test's servers.
type Sink struct {
	fd       int
	done     chan struct{}
	Accepted atomic.Int64
}

// StartSink listens on IPv4 port in namespace ns. Close stops it.
func StartSink(ns string, port int) (*Sink, error) {
	s := &Sink{fd: -1, done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(s.done)
		runtime.LockOSThread() // never unlocked: the thread dies with us
		if err := enterNetns(ns); err != nil {
			ready <- err
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			ready <- fmt.Errorf("sink: %w", err)
			return
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
			unix.Close(fd)
			ready <- fmt.Errorf("sink: bind %d in %s: %w", port, ns, err)
			return
		}
		if err := unix.Listen(fd, 4096); err != nil {
			unix.Close(fd)
			ready <- fmt.Errorf("sink: listen: %w", err)
			return
		}
		s.fd = fd
		ready <- nil
		for {
			c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			if err != nil {
				return // shut down by Close
			}
			s.Accepted.Add(1)
			unix.Close(c)
		}
	}()
	if err := <-ready; err != nil {
		<-s.done
		return nil, err
	}
	return s, nil
}

// Close stops accepting and waits for the accepting thread to end.
func (s *Sink) Close() {
	unix.Shutdown(s.fd, unix.SHUT_RDWR) // wakes the blocked accept
	<-s.done
	unix.Close(s.fd)
}

// LoadResult is what Load saw.
type LoadResult struct {
	OK, Failed int
	Took       time.Duration
	Errors     map[string]int // failure counts by error text
}

// Rate is the connections per second that completed.
func (r LoadResult) Rate() float64 { return float64(r.OK) / r.Took.Seconds() }

// Load opens TCP connections from namespace ns to addr (IPv4) at rate per
// second for d, from workers threads that each stay in the namespace and
// connect, then close, in blocking system calls. A connection counts as
// OK when its handshake completes within a second. A worker that falls
// behind its schedule connects at once, so the rate reached says what the
// machine could do.
func Load(ns string, addr netip.AddrPort, rate float64, d time.Duration, workers int) (LoadResult, error) {
	total := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	sa := &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}
	var (
		next   atomic.Int64 // the next connection's index
		ok     atomic.Int64
		mu     sync.Mutex
		errs   = map[string]int{}
		wg     sync.WaitGroup
		failed = make(chan error, workers)
	)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked
			if err := enterNetns(ns); err != nil {
				failed <- err
				return
			}
			for {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
					time.Sleep(wait)
				}
				if err := connectOnce(sa); err != nil {
					mu.Lock()
					errs[err.Error()]++
					mu.Unlock()
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	close(failed)
	if err := <-failed; err != nil {
		return LoadResult{}, err
	}
	r := LoadResult{OK: int(ok.Load()), Took: time.Since(start), Errors: errs}
	for _, n := range errs {
		r.Failed += n
	}
	return r, nil
}

// connectOnce completes one TCP handshake to sa (within a second) and closes.
func connectOnce(sa *unix.SockaddrInet4) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	// Non-blocking, then poll: a blocking connect returns EINTR when the Go
	// runtime signals the thread, and cannot be resumed.
	if err := unix.SetNonblock(fd, true); err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	if err := unix.Connect(fd, sa); err != nil && err != unix.EINPROGRESS {
		return fmt.Errorf("connect: %w", err)
	}
	deadline := time.Now().Add(time.Second)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("connect: %w", unix.ETIMEDOUT)
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll: %w", err)
		}
		break
	}
	if soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soErr != 0 {
		if err == nil {
			err = unix.Errno(soErr)
		}
		return fmt.Errorf("connect: %w", err)
	}
	// Close with a reset: the client keeps no TIME_WAIT socket, whose ports
	// would make each connect's port search slower as the load goes on.
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	return nil
}

// enterNetns moves the calling (locked) thread into the named namespace.
func enterNetns(name string) error {
	h, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return fmt.Errorf("netns %s: enter: %w", name, err)
	}
	return nil
}
