// Command coredns is CoreDNS with only the plugins kubeadm's default Corefile
// uses (errors, health, ready, kubernetes, prometheus, forward, cache, loop,
// reload, loadbalance) plus log, so that the node image's coredns image builds
// from github.com/coredns/coredns without the dependencies of every other
// plugin. Built by `cargo xtask node-image`.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// dnsserver.Directives keeps CoreDNS's own list (its plugin.cfg order); the
// directives of plugins not linked in are never used by kubeadm's Corefile.
var _ = dnsserver.Directives

func main() {
	coremain.Run()
}
