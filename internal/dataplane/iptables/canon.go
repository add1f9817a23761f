package iptables

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// canonRule returns a form of one rule (the arguments after "-A chain")
// that is the same for what vipproxy writes and what iptables-save prints
// back for it: match options as a sorted set of (negation, option, values)
// with -m module names dropped (each option names its own semantics),
// /32 and /128 removed, numbers in one notation, and the options
// iptables-save adds by default (recent --mask/--rsource, REJECT's default
// --reject-with) removed; the target and its options in order, MARK
// options as --set-xmark. Two rules with the same canonical form do the
// same; rules it cannot parse get a form that equals nothing.
func canonRule(rule string) string {
	args, err := SplitArgs(rule)
	if err != nil {
		return "\x00" + rule
	}
	var matches []string
	var target []string
	for i := 0; i < len(args); {
		neg := false
		if args[i] == "!" {
			neg = true
			i++
			if i >= len(args) {
				return "\x00" + rule
			}
		}
		opt := args[i]
		i++
		var vals []string
		for i < len(args) && !strings.HasPrefix(args[i], "-") && args[i] != "!" {
			vals = append(vals, canonValue(opt, args[i]))
			i++
		}
		if opt == "-j" {
			target = append([]string{"-j"}, vals...)
			target = append(target, canonTarget(vals, args[i:])...)
			break
		}
		switch {
		case opt == "-m":
			continue
		case opt == "--mask" && len(vals) == 1 && (vals[0] == "255.255.255.255" || vals[0] == "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"):
			continue
		case opt == "--rsource":
			continue
		}
		u := opt + " " + strings.Join(vals, " ")
		if neg {
			u = "! " + u
		}
		matches = append(matches, u)
	}
	slices.Sort(matches)
	return strings.Join(matches, " | ") + " || " + strings.Join(target, " ")
}

func canonValue(opt, v string) string {
	switch opt {
	case "-s", "-d", "--source", "--destination":
		v = strings.TrimSuffix(strings.TrimSuffix(v, "/32"), "/128")
	case "--probability":
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			v = strconv.FormatFloat(f, 'f', 8, 64)
		}
	case "--mark":
		v = canonMark(v)
	case "-p":
		v = strings.ToLower(v)
	}
	return v
}

func canonMark(v string) string {
	vm := strings.SplitN(v, "/", 2)
	out := make([]string, 0, 2)
	for _, p := range vm {
		n, err := strconv.ParseUint(p, 0, 32)
		if err != nil {
			return v
		}
		out = append(out, fmt.Sprintf("%#x", n))
	}
	if len(out) == 1 {
		out = append(out, "0xffffffff")
	}
	return strings.Join(out, "/")
}

// canonTarget canonicalizes target options (rest follows "-j TARGET").
func canonTarget(target []string, rest []string) []string {
	name := ""
	if len(target) > 0 {
		name = target[0]
	}
	switch name {
	case "MARK":
		if len(rest) == 2 {
			n, err := strconv.ParseUint(strings.SplitN(rest[1], "/", 2)[0], 0, 32)
			if err == nil {
				switch rest[0] {
				case "--or-mark":
					return []string{"--set-xmark", fmt.Sprintf("%#x/%#x", n, n)}
				case "--xor-mark":
					return []string{"--set-xmark", fmt.Sprintf("%#x/0x0", n)}
				case "--set-xmark":
					return []string{"--set-xmark", canonMark(rest[1])}
				}
			}
		}
	case "REJECT":
		if len(rest) == 0 {
			return []string{"--reject-with", "port-unreachable"}
		}
		if len(rest) == 2 && rest[0] == "--reject-with" && strings.HasSuffix(rest[1], "port-unreachable") {
			return []string{"--reject-with", "port-unreachable"}
		}
	}
	return rest
}
