package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	gnft "github.com/google/nftables"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// Transport is the narrow boundary between the proxier and the kernel. The
// proxier builds knftables Transactions; a Transport runs them atomically
// and answers one cheap question about what is installed. FakeTransport
// (over knftables.Fake) serves the unit tests; NFT runs the nft binary
// and, as an Elementer (see elements.go), sends transactions made only of
// map and set elements as one netlink batch.
type Transport interface {
	// NewTransaction returns an empty transaction. Every object added to
	// it names its Family and Table explicitly.
	NewTransaction() *knftables.Transaction
	// Run applies tx atomically: on error nothing of tx is in force.
	Run(ctx context.Context, tx *knftables.Transaction) error
	// Probe reports whether table exists in family and, when chain is not
	// empty, how many rules chain holds (0 when the chain is missing). It
	// must not list the whole ruleset.
	Probe(ctx context.Context, family knftables.Family, table, chain string) (exists bool, rules int, err error)
}

// FakeTransport runs transactions against a knftables.Fake created with an
// empty family and table (so it holds every table of every family).
type FakeTransport struct {
	Fake *knftables.Fake
	// Err, when set, makes the next Run fail with it (and clears it).
	Err error
}

// NewFakeTransport returns a FakeTransport over a fresh knftables.Fake.
func NewFakeTransport() *FakeTransport {
	return &FakeTransport{Fake: knftables.NewFake("", "")}
}

// NewTransaction implements Transport.
func (f *FakeTransport) NewTransaction() *knftables.Transaction { return f.Fake.NewTransaction() }

// Run implements Transport.
func (f *FakeTransport) Run(ctx context.Context, tx *knftables.Transaction) error {
	if err := f.Err; err != nil {
		f.Err = nil
		return err
	}
	return f.Fake.Run(ctx, tx)
}

// Probe implements Transport.
func (f *FakeTransport) Probe(_ context.Context, family knftables.Family, table, chain string) (bool, int, error) {
	f.Fake.RLock()
	defer f.Fake.RUnlock()
	t := f.Fake.Tables[family][table]
	if t == nil {
		return false, 0, nil
	}
	if chain == "" {
		return true, 0, nil
	}
	c := t.Chains[chain]
	if c == nil {
		return true, 0, nil
	}
	return true, len(c.Rules), nil
}

// NFT runs transactions with the nft binary (`nft -f -`, one process per
// transaction, so each is atomic) and probes over netlink, which reads
// only the one table and chain asked for. The zero value runs "nft" from
// PATH in the caller's network namespace.
type NFT struct {
	// Path is the nft binary; "" means "nft" from PATH.
	Path string
	// Netns, when set, names a network namespace (/run/netns/<Netns>):
	// nft runs under `ip netns exec` and probes use that namespace.
	Netns string
}

var emptyFake = knftables.NewFake("", "")

// NewTransaction implements Transport.
func (n *NFT) NewTransaction() *knftables.Transaction { return emptyFake.NewTransaction() }

// Run implements Transport.
func (n *NFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	path := n.Path
	if path == "" {
		path = "nft"
	}
	args := []string{path, "-f", "-"}
	if n.Netns != "" {
		args = append([]string{"ip", "netns", "exec", n.Netns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(batchElements(tx.String()))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[:2000] + "..."
		}
		return fmt.Errorf("nft: %w: %s", err, msg)
	}
	return nil
}

var gnftFamilies = map[knftables.Family]gnft.TableFamily{
	knftables.IPv4Family: gnft.TableFamilyIPv4,
	knftables.IPv6Family: gnft.TableFamilyIPv6,
	knftables.InetFamily: gnft.TableFamilyINet,
}

// Probe implements Transport over netlink.
func (n *NFT) Probe(_ context.Context, family knftables.Family, table, chain string) (bool, int, error) {
	fam, ok := gnftFamilies[family]
	if !ok {
		return false, 0, fmt.Errorf("nft probe: unsupported family %q", family)
	}
	conn, closeNS, err := n.conn()
	if err != nil {
		return false, 0, fmt.Errorf("nft probe: %w", err)
	}
	defer closeNS()
	t, err := conn.ListTableOfFamily(table, fam)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || isNotFound(err) {
			return false, 0, nil
		}
		return false, 0, fmt.Errorf("nft probe: table %s %s: %w", family, table, err)
	}
	if chain == "" {
		return true, 0, nil
	}
	rules, err := conn.GetRules(t, &gnft.Chain{Name: chain, Table: t})
	if err != nil {
		if errors.Is(err, unix.ENOENT) || isNotFound(err) {
			return true, 0, nil
		}
		return true, 0, fmt.Errorf("nft probe: chain %s %s %s: %w", family, table, chain, err)
	}
	return true, len(rules), nil
}

func isNotFound(err error) bool {
	s := err.Error()
	return strings.Contains(s, "no such file or directory") || strings.Contains(s, "not found")
}

// batchElements merges runs of consecutive "add element" (or "delete
// element") commands on the same set or map into one command. Each
// command costs nft a separate parse and evaluation; batched, loading
// 100,000 map elements takes about a third less time. Order between
// different commands is kept, so the transaction means the same.
func batchElements(text string) string {
	var b strings.Builder
	b.Grow(len(text))
	prefix := ""
	open := false
	for len(text) > 0 {
		line := text
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = ""
		}
		p, body, ok := splitElementLine(line)
		if ok && open && p == prefix {
			b.WriteString(", ")
			b.WriteString(body)
			continue
		}
		if open {
			b.WriteString(" }\n")
			open = false
		}
		if ok {
			prefix, open = p, true
			b.WriteString(p)
			b.WriteString(" { ")
			b.WriteString(body)
			continue
		}
		b.WriteString(line)
		b.WriteString("\n")
	}
	if open {
		b.WriteString(" }\n")
	}
	return b.String()
}

// splitElementLine splits "add element ip t m { body }" into
// "add element ip t m" and "body".
func splitElementLine(line string) (string, string, bool) {
	if !strings.HasPrefix(line, "add element ") && !strings.HasPrefix(line, "delete element ") {
		return "", "", false
	}
	i := strings.Index(line, " { ")
	if i < 0 || !strings.HasSuffix(line, " }") || strings.Contains(line[i+3:len(line)-2], "{") {
		return "", "", false
	}
	return line[:i], line[i+3 : len(line)-2], true
}
