package l4proxy

import (
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
)

// sinkBackend reads each connection to EOF and closes it.
func sinkBackend(b *testing.B) netip.AddrPort {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// target returns the address to benchmark against: the backend itself
// (direct) or a Proxy in front of it.
func target(b *testing.B, backend netip.AddrPort, viaProxy bool) string {
	if !viaProxy {
		return backend.String()
	}
	p := &Proxy{}
	p.SetEndpoints([]Endpoint{{Addr: backend}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go p.ServeTCP(ln)
	b.Cleanup(func() { p.Close() })
	return ln.Addr().String()
}

const (
	benchStreams = 64
	benchTotal   = 256 << 20 // bytes per op, split over the streams
)

// BenchmarkThroughput sends 256 MiB per op over 64 concurrent streams to a
// sink, directly and through a Proxy. Run with -benchtime=1x (or a small
// count) to keep it bounded; compare the MB/s of the two sub-benchmarks.
func BenchmarkThroughput(b *testing.B) {
	for _, via := range []struct {
		name  string
		proxy bool
	}{{"direct", false}, {"proxy", true}} {
		b.Run(via.name, func(b *testing.B) {
			addr := target(b, sinkBackend(b), via.proxy)
			chunk := make([]byte, 256<<10)
			b.SetBytes(benchTotal)
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				errs := make(chan error, benchStreams)
				for range benchStreams {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c, err := net.Dial("tcp", addr)
						if err != nil {
							errs <- err
							return
						}
						defer c.Close()
						for left := benchTotal / benchStreams; left > 0; left -= len(chunk) {
							if _, err := c.Write(chunk[:min(left, len(chunk))]); err != nil {
								errs <- err
								return
							}
						}
						// Wait for the sink to see EOF and close: all bytes arrived.
						c.(*net.TCPConn).CloseWrite()
						io.Copy(io.Discard, c)
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkConnect opens a connection, sends one byte, half-closes and
// waits for the close, directly and through a Proxy: connections/s is
// 1/(ns/op).
func BenchmarkConnect(b *testing.B) {
	for _, via := range []struct {
		name  string
		proxy bool
	}{{"direct", false}, {"proxy", true}} {
		b.Run(via.name, func(b *testing.B) {
			addr := target(b, sinkBackend(b), via.proxy)
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						b.Error(err)
						return
					}
					c.Write([]byte{1})
					c.(*net.TCPConn).CloseWrite()
					io.Copy(io.Discard, c)
					c.Close()
				}
			})
		})
	}
}
