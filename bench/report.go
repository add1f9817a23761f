//go:build linux

package bench

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// fmtDur prints a duration with three significant digits and a unit.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.3g ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.3g s", d.Seconds())
	}
}

func (r Result) cold() string {
	if r.ColdTO {
		return "> timeout"
	}
	return fmtDur(r.Cold)
}

func (r Result) prog() string {
	if r.ProgN == 0 {
		if r.ProgTO > 0 {
			return "> timeout"
		}
		return "—"
	}
	s := fmt.Sprintf("%s / %s (%d)", fmtDur(r.ProgP50), fmtDur(r.ProgP99), r.ProgN)
	if r.ProgTO > 0 {
		s += ", then the cap ended the measurement"
	}
	return s
}

func (r Result) rss() string { return mib(r.RSS) }

func (r Result) rssSteady() string { return mib(r.RSSSteady) }

func (r Result) rssIdle() string { return mib(r.RSSIdle) }

func (r Result) rssPeak() string { return mib(r.RSSPeak) }

func mib(b uint64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}

func (r Result) cpu() string {
	if r.RSS == 0 {
		return "—"
	}
	s := fmt.Sprintf("%.2f s", r.CPU.Seconds())
	if r.ChangeCPU > 0 {
		s += fmt.Sprintf(", %s per change", fmtDur(r.ChangeCPU))
	}
	return s
}

func (l Latency) String() string {
	if l.N == 0 {
		return "—"
	}
	return fmt.Sprintf("%s / %s", fmtDur(l.P50), fmtDur(l.P99))
}

func (r Result) load() string {
	if r.Load == 0 {
		return "—"
	}
	return fmtDur(r.Load)
}

// String is one line for logs.
func (r Result) String() string {
	return fmt.Sprintf("%s N=%d cold=%s prog=%s rss=%s rss-steady=%s rss-idle=%s rss-peak=%s cpu=%s conn(N)=%s conn(10)=%s restart=%s %s",
		r.Target, r.N, r.cold(), r.prog(), r.rss(), r.rssSteady(), r.rssIdle(), r.rssPeak(), r.cpu(), r.Conn, r.Conn10, r.Restart, r.Note)
}

var header = []string{"target", "N", "cold start", "programming p50 / p99 (changes)",
	"RSS", "RSS after changes", "RSS idle", "peak RSS", "CPU s (cold start, per change)", "connect p50 / p99, N Svcs", "connect p50 / p99, 10 Svcs", "API load", "restart: ready, failed connects", "note"}

func (r Result) row() []string {
	return []string{r.Target.String(), fmt.Sprint(r.N), r.cold(), r.prog(), r.rss(), r.rssSteady(), r.rssIdle(), r.rssPeak(), r.cpu(),
		r.Conn.String(), r.Conn10.String(), r.load(), r.Restart.String(), r.Note}
}

// Ratio compares vipproxy with kube-proxy in one mode at one N: each field
// is kube-proxy's value divided by vipproxy's (> 1: vipproxy is better).
type Ratio struct {
	N              int
	Vip, Kube      Target
	Cold, P50, P99 string
	RSS, CPU       string
	// After the changes, idle, and the restart's time to its first sync.
	RSSSteady, RSSIdle, Restart string
}

func ratio(kube, vip float64, kubeTO, vipTO bool) string {
	switch {
	case vipTO && kubeTO:
		return "both > timeout"
	case kubeTO && vip > 0:
		return "kube-proxy > timeout"
	case vipTO:
		return "vipproxy > timeout"
	case kube <= 0 || vip <= 0:
		return "—"
	}
	return fmt.Sprintf("%.1f×", kube/vip)
}

// Ratios pairs every vipproxy result with the kube-proxy result of the same
// mode and N.
func Ratios(rs []Result) []Ratio {
	var out []Ratio
	for _, v := range rs {
		if v.Target.Proxy != "vipproxy" {
			continue
		}
		for _, k := range rs {
			if k.Target.Proxy != "kube-proxy" || k.N != v.N || k.Target.Mode != v.Target.Mode {
				continue
			}
			out = append(out, Ratio{N: v.N, Vip: v.Target, Kube: k.Target,
				Cold: ratio(k.Cold.Seconds(), v.Cold.Seconds(), k.ColdTO, v.ColdTO),
				P50:  ratio(k.ProgP50.Seconds(), v.ProgP50.Seconds(), k.ProgN == 0 && k.ProgTO > 0, v.ProgN == 0 && v.ProgTO > 0),
				P99:  ratio(k.ProgP99.Seconds(), v.ProgP99.Seconds(), k.ProgN == 0 && k.ProgTO > 0, v.ProgN == 0 && v.ProgTO > 0),
			})
			// RSS and CPU after a cold start that never finished are not
			// comparable (the CPU of a still-running nft child is missing).
			q := &out[len(out)-1]
			if k.ColdTO || v.ColdTO {
				q.RSS, q.CPU = "—", "—"
			} else {
				q.RSS = ratio(float64(k.RSS), float64(v.RSS), false, false)
				q.CPU = ratio(k.CPU.Seconds(), v.CPU.Seconds(), false, false)
			}
			q.RSSSteady = ratio(float64(k.RSSSteady), float64(v.RSSSteady), false, false)
			q.RSSIdle = ratio(float64(k.RSSIdle), float64(v.RSSIdle), false, false)
			q.Restart = ratio(k.Restart.Synced.Seconds(), v.Restart.Synced.Seconds(), false, false)
		}
	}
	return out
}

var ratioHeader = []string{"N", "vipproxy", "kube-proxy", "cold start", "programming p50", "programming p99", "RSS", "CPU s",
	"RSS after changes", "RSS idle", "restart (synced)"}

func (q Ratio) row() []string {
	return []string{fmt.Sprint(q.N), q.Vip.String(), q.Kube.String(), q.Cold, q.P50, q.P99, q.RSS, q.CPU,
		q.RSSSteady, q.RSSIdle, q.Restart}
}

// PrintTable writes the results (and the ratios, if any) as aligned text.
func PrintTable(w io.Writer, rs []Result) {
	rows := [][]string{header}
	for _, r := range rs {
		rows = append(rows, r.row())
	}
	printAligned(w, rows)
	if qs := Ratios(rs); len(qs) > 0 {
		fmt.Fprintln(w, "\nkube-proxy ÷ vipproxy (same run; > 1 means vipproxy is faster / smaller):")
		rows := [][]string{ratioHeader}
		for _, q := range qs {
			rows = append(rows, q.row())
		}
		printAligned(w, rows)
	}
}

func printAligned(w io.Writer, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-len([]rune(c))+2))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// Markdown writes the results and ratios as Markdown tables.
func Markdown(w io.Writer, rs []Result) {
	mdTable(w, header, rs, func(r Result) []string { return r.row() })
	if qs := Ratios(rs); len(qs) > 0 {
		fmt.Fprintln(w, "\nkube-proxy ÷ vipproxy, same run (> 1: vipproxy is faster / smaller):")
		fmt.Fprintln(w)
		mdTable(w, ratioHeader, qs, func(q Ratio) []string { return q.row() })
	}
}

func mdTable[T any](w io.Writer, head []string, items []T, row func(T) []string) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(head, " | "))
	fmt.Fprintf(w, "|%s\n", strings.Repeat(" --- |", len(head)))
	for _, it := range items {
		cells := row(it)
		for i, c := range cells {
			cells[i] = strings.ReplaceAll(c, "|", "\\|")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// Machine describes the host: CPUs (nproc), memory, kernel.
func Machine() string {
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseUint(f[1], 10, 64); err == nil {
					mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				}
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = " (" + strings.TrimSpace(v) + ")"
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs%s, %s memory, Linux %s, %s", runtime.NumCPU(), model, mem, kernel, runtime.Version())
}

// LoadAvg returns the 1-, 5- and 15-minute load averages ("?" if unknown):
// on a shared machine they say how much the numbers are disturbed.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// WriteReport writes the whole Markdown report of one run: machine, date,
// command, the results and the ratios, and how each column is measured.
func WriteReport(w io.Writer, rs []Result, machine, command string, start time.Time, took time.Duration) error {
	fmt.Fprintf(w, "# Benchmarks\n\n")
	fmt.Fprintf(w, "Written by `bench/cmd/vipproxy-bench` (see bench/doc.go for what each column measures).\n\n")
	fmt.Fprintf(w, "- machine: %s\n", machine)
	fmt.Fprintf(w, "- date: %s (run took %s)\n", start.UTC().Format("2006-01-02 15:04 MST"), took.Round(time.Second))
	fmt.Fprintf(w, "- command (as root, from the repository root): `%s`\n\n", command)
	Markdown(w, rs)
	fmt.Fprintf(w, "\n%s\n", legend)
	return nil
}

const legend = `Columns: **cold start** — proxy process start → first successful TCP connect through the last
Service's VIP (objects already in the manifests directory or the API server). **programming** —
manifest write (standalone) or EndpointSlice update through the API (Kubernetes mode) → first
successful TCP connect through that Service's VIP (its endpoints move from a port nothing
listens on to the real backends), over the number of changes in brackets, each after the
previous one showed plus a pause longer than kube-proxy's 1 s default minSyncPeriod. **RSS / CPU s** —
VmRSS and utime+stime+cutime+cstime (children included: nft, iptables-restore) of the proxy
after the cold start once its CPU went quiet; after it, the CPU from the first change until
the CPU went quiet after the last, divided by the changes. **RSS after changes** — VmRSS after the
changes once the CPU went quiet; **RSS idle** (with -idle D) — VmRSS D later, nothing else
happening; **peak RSS** — VmHWM then, the largest RSS of the process's life. **connect** — TCP connect time from the node
namespace through ClusterIPs with real backends, p50 / p99 over 300 connects, with N Services
and with 10 Services. **API load** — creating all Services and EndpointSlices through the API
server (not part of any other column). **restart** (with -restart) — the proxy stopped and
started again after the changes, a client connecting through a VIP every 10 ms: new process
start → /healthz 200, in brackets → its first sync (kubeproxy_sync_proxy_rules_last_timestamp_seconds
past its start), and the connects that failed. "> timeout": did not finish within the cap.`
