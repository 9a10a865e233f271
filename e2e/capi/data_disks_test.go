package capi

import (
	"strings"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/cluster-api/test/framework"
)

// etcdDiskMounted reads each control-plane node's /var/log/cloud-init.log
// through its kubelet (what `kubectl get --raw
// /api/v1/nodes/NODE/proxy/logs/cloud-init.log` shows) and expects cloud-init
// to have made the file system labelled etcd_disk on the etcd data disk and
// mounted it without a failure.
func etcdDiskMounted(management framework.ClusterProxy, namespace, name string) {
	workload := management.GetWorkloadCluster(ctx, namespace, name)
	clients := workload.GetClientSet()
	nodes, err := clients.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "node-role.kubernetes.io/control-plane"})
	Expect(err).NotTo(HaveOccurred())
	Expect(nodes.Items).NotTo(BeEmpty(), "the workload cluster has no control-plane node")
	for _, node := range nodes.Items {
		raw, err := clients.CoreV1().RESTClient().Get().
			AbsPath("/api/v1/nodes", node.Name, "proxy/logs/cloud-init.log").DoRaw(ctx)
		Expect(err).NotTo(HaveOccurred(), "reading node %s's cloud-init log through its kubelet", node.Name)
		log := string(raw)
		Expect(log).To(ContainSubstring("Creating file system etcd_disk on /dev/"),
			"node %s: cloud-init made no file system on the etcd disk", node.Name)
		Expect(log).To(ContainSubstring("Activate mounts: PASS:mount -a"),
			"node %s: cloud-init did not mount the etcd disk", node.Name)
		Expect(strings.Contains(log, "Activate mounts: FAIL")).To(BeFalse(),
			"node %s: a mount failed", node.Name)
	}
}
