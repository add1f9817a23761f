package allocator

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteTable writes list as an aligned text table, one Service a line:
//
//	NAMESPACE  NAME  CLUSTER-IPS         NODE-PORTS      HEALTH-CHECK-NODE-PORT
//	default    web   10.96.0.10,fd00::a  http/TCP:30080  -
//
// NODE-PORTS lists each NodePort as name/PROTOCOL:nodePort ("-" when none).
// It is what "vipproxy services" prints.
func WriteTable(w io.Writer, list []Assignment) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tCLUSTER-IPS\tNODE-PORTS\tHEALTH-CHECK-NODE-PORT")
	for _, a := range list {
		ips := make([]string, len(a.ClusterIPs))
		for i, ip := range a.ClusterIPs {
			ips[i] = ip.String()
		}
		ports := make([]string, len(a.NodePorts))
		for i, p := range a.NodePorts {
			name := p.Name
			if name != "" {
				name += "/"
			}
			ports[i] = name + string(p.Protocol) + ":" + strconv.Itoa(int(p.NodePort))
		}
		hc := "-"
		if a.HealthCheckNodePort != 0 {
			hc = strconv.Itoa(int(a.HealthCheckNodePort))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Service.Namespace, a.Service.Name,
			orDash(strings.Join(ips, ",")), orDash(strings.Join(ports, ",")), hc)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
