package l4proxy

import (
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
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

// transfer sends total bytes over streams concurrent connections to addr
// and waits until the sink has read them all.
func transfer(addr string, streams, total int) error {
	chunk := make([]byte, 256<<10)
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for left := total / streams; left > 0; left -= len(chunk) {
				if _, err := c.Write(chunk[:min(left, len(chunk))]); err != nil {
					errs <- err
					return
				}
			}
			c.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, c)
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// connects opens n connections one after another (one byte each way
// closed) and returns how long they took.
func connects(addr string, n int) (time.Duration, error) {
	start := time.Now()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return 0, err
		}
		c.Write([]byte{1})
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
		c.Close()
	}
	return time.Since(start), nil
}

// BenchmarkPaired measures direct and proxied runs back to back within
// each op, so that load from other processes affects both alike, and
// reports the medians and the proxy/direct ratios: throughput (256 MiB
// over 64 streams each way per op) and sequential connections/s (500 each
// way per op). Run with -benchtime=3x or so.
func BenchmarkPaired(b *testing.B) {
	backend := sinkBackend(b)
	direct, proxied := target(b, backend, false), target(b, backend, true)
	var dBps, pBps, dCps, pCps []float64
	for range b.N {
		for _, r := range []struct {
			addr string
			bps  *[]float64
			cps  *[]float64
		}{{direct, &dBps, &dCps}, {proxied, &pBps, &pCps}} {
			start := time.Now()
			if err := transfer(r.addr, benchStreams, benchTotal); err != nil {
				b.Fatal(err)
			}
			*r.bps = append(*r.bps, float64(benchTotal)/time.Since(start).Seconds()/1e6)
			d, err := connects(r.addr, 500)
			if err != nil {
				b.Fatal(err)
			}
			*r.cps = append(*r.cps, 500/d.Seconds())
		}
	}
	med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(dBps), "direct-MB/s")
	b.ReportMetric(med(pBps), "proxy-MB/s")
	b.ReportMetric(med(pBps)/med(dBps), "bytes-ratio")
	b.ReportMetric(med(dCps), "direct-conn/s")
	b.ReportMetric(med(pCps), "proxy-conn/s")
	b.ReportMetric(med(pCps)/med(dCps), "conn-ratio")
}
