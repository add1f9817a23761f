//go:build linux

package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Backend is a set of TCP and UDP servers running in one (pod) namespace.
// Every server answers with a Reply line naming the backend, the protocol, the
// local port and the remote address it saw. TCP servers then echo every byte
// they receive until the client half-closes, so streams can be checked
// byte-exact. Listeners are dual-stack (":port").
type Backend struct {
	Name string
	NS   string

	mu      sync.Mutex
	closers map[io.Closer]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// Reply is what a backend answers: "<name> <proto> <localport> <remote>".
type Reply struct {
	Backend string
	Proto   string
	Port    int
	Source  netip.AddrPort
}

func (r Reply) String() string {
	return fmt.Sprintf("%s %s %d %s", r.Backend, r.Proto, r.Port, r.Source)
}

// ParseReply parses one reply line (without or with the trailing newline).
func ParseReply(line string) (Reply, error) {
	f := strings.Fields(line)
	if len(f) != 4 {
		return Reply{}, fmt.Errorf("reply %q: want 4 fields", line)
	}
	port, err := strconv.Atoi(f[2])
	if err != nil {
		return Reply{}, fmt.Errorf("reply %q: port: %w", line, err)
	}
	src, err := netip.ParseAddrPort(f[3])
	if err != nil {
		return Reply{}, fmt.Errorf("reply %q: source: %w", line, err)
	}
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	return Reply{Backend: f[0], Proto: f[1], Port: port, Source: src}, nil
}

// StartBackend starts servers named name in namespace ns on the given TCP and
// UDP ports. Close stops them.
func StartBackend(ns, name string, tcpPorts, udpPorts []int) (*Backend, error) {
	b := &Backend{Name: name, NS: ns, closers: map[io.Closer]struct{}{}}
	err := InNetns(ns, func() error {
		for _, p := range tcpPorts {
			l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
			if err != nil {
				return fmt.Errorf("backend %s: %w", name, err)
			}
			b.track(l)
			b.wg.Add(1)
			go b.serveTCP(l, p)
		}
		for _, p := range udpPorts {
			c, err := net.ListenPacket("udp", ":"+strconv.Itoa(p))
			if err != nil {
				return fmt.Errorf("backend %s: %w", name, err)
			}
			b.track(c)
			b.wg.Add(1)
			go b.serveUDP(c, p)
		}
		return nil
	})
	if err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Backend) track(c io.Closer) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		c.Close()
		return false
	}
	b.closers[c] = struct{}{}
	return true
}

func (b *Backend) untrack(c io.Closer) {
	b.mu.Lock()
	delete(b.closers, c)
	b.mu.Unlock()
}

// Close stops every server and connection of the backend and waits for them.
func (b *Backend) Close() {
	b.mu.Lock()
	b.closed = true
	for c := range b.closers {
		c.Close()
	}
	b.closers = map[io.Closer]struct{}{}
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *Backend) serveTCP(l net.Listener, port int) {
	defer b.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if !b.track(c) {
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer b.untrack(c)
			defer c.Close()
			r := Reply{Backend: b.Name, Proto: "tcp", Port: port, Source: addrPort(c.RemoteAddr())}
			if _, err := io.WriteString(c, r.String()+"\n"); err != nil {
				return
			}
			io.Copy(c, c) // echo until the client half-closes
		}()
	}
}

func (b *Backend) serveUDP(c net.PacketConn, port int) {
	defer b.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		_, from, err := c.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		r := Reply{Backend: b.Name, Proto: "udp", Port: port, Source: addrPort(from)}
		c.WriteTo([]byte(r.String()+"\n"), from)
	}
}

func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// Dial connects from namespace ns to addr over proto ("tcp" or "udp"), reads
// the backend's Reply and closes. For UDP it sends one datagram and waits for
// the answer. Every step is bounded by opts' timeout (1 s by default). A
// refused connection yields an error matching syscall.ECONNREFUSED.
func Dial(ns, proto, addr string) (Reply, error) {
	return DialWith(ns, proto, addr, DialOptions{})
}

// DialWith is Dial with options (source address/port, timeout).
func DialWith(ns, proto, addr string, o DialOptions) (Reply, error) {
	c, err := DialConn(ns, proto, addr, o)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(o.timeout()))
	if proto == "udp" {
		if _, err := c.Write([]byte("hello\n")); err != nil {
			return Reply{}, err
		}
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		if err != nil {
			return Reply{}, err
		}
		return ParseReply(string(buf[:n]))
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return Reply{}, fmt.Errorf("read reply: %w", err)
	}
	return ParseReply(line)
}
