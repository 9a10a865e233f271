package capi

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capie2e "sigs.k8s.io/cluster-api/test/e2e"
	"sigs.k8s.io/cluster-api/test/framework"
	"sigs.k8s.io/cluster-api/test/framework/clusterctl"
	"sigs.k8s.io/cluster-api/util"
)

// virshURIVariable is the e2e config variable with the URI through which
// virsh on this machine reaches the specs' libvirt host (`capl-e2e capi`
// sets it to the containerized libvirtd's unix socket).
const virshURIVariable = "CAPL_E2E_VIRSH_URI"

// The provider's API version, and its kind this spec reads; the suite has no
// Go types for the provider's kinds, so they are read as unstructured objects.
const libvirtAPIVersion = "v1alpha1"

var libvirtRemediationGVK = schema.GroupVersionKind{
	Group:   "infrastructure.cluster.x-k8s.io",
	Version: libvirtAPIVersion,
	Kind:    "LibvirtRemediation",
}

// libvirtRemediation is what the spec checks of a LibvirtRemediation.
type libvirtRemediation struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Status   struct {
		Phase          string             `json:"phase"`
		RetryCount     int32              `json:"retryCount"`
		LastRemediated *metav1.Time       `json:"lastRemediated"`
		Conditions     []metav1.Condition `json:"conditions"`
	} `json:"status"`
}

// rebooted is its `Rebooted` condition (nil when it has none).
func (r *libvirtRemediation) rebooted() *metav1.Condition {
	return meta.FindStatusCondition(r.Status.Conditions, "Rebooted")
}

// remediationRebootSpecInput is remediationRebootSpec's input, the fields of
// the upstream specs' inputs it needs.
type remediationRebootSpecInput struct {
	E2EConfig             *clusterctl.E2EConfig
	ClusterctlConfigPath  string
	BootstrapClusterProxy framework.ClusterProxy
	ArtifactFolder        string
	SkipCleanup           bool
}

// remediationRebootSpec checks the provider's remediation by reboot with a
// cluster of the remediation-reboot flavor (one control-plane machine, one
// worker; a MachineHealthCheck of the worker whose remediation is a
// LibvirtRemediationTemplate, one reboot, 480 s to be healthy after it):
//
//  1. a reboot helps: the worker's guest is paused on the host, its Node
//     turns Ready Unknown, the MachineHealthCheck creates a LibvirtRemediation
//     named after the Machine, the provider power-cycles the domain, the Node
//     is Ready again and the MachineHealthCheck deletes the LibvirtRemediation;
//     the worker is the same Machine, LibvirtMachine and domain;
//  2. a reboot cannot help: the Node gets the condition
//     `e2e.remediation.condition` False, which no kubelet clears; the provider
//     resets the running domain, gives up after timeoutSeconds (`Failed`,
//     `RetriesExhausted`) and sets the Machine's OwnerRemediated False, and
//     the MachineSet deletes the Machine (its LibvirtRemediation and domain
//     go with it) and makes a new one whose Node is Ready.
//
// Set up and torn down as the upstream specs are: a namespace of its own,
// the cluster made with ApplyClusterTemplateAndWait, resources dumped and the
// cluster deleted at the end.
func remediationRebootSpec(ctx context.Context, inputGetter func() remediationRebootSpecInput) {
	const specName = "remediation-reboot"
	var (
		input            remediationRebootSpecInput
		namespace        *corev1.Namespace
		cancelWatches    context.CancelFunc
		clusterResources *clusterctl.ApplyClusterTemplateAndWaitResult
	)

	BeforeEach(func() {
		input = inputGetter()
		Expect(input.E2EConfig).NotTo(BeNil(), "%s needs the e2e config", specName)
		Expect(input.ClusterctlConfigPath).To(BeAnExistingFile(), "%s needs the clusterctl config", specName)
		Expect(input.BootstrapClusterProxy).NotTo(BeNil(), "%s needs the management cluster", specName)
		Expect(os.MkdirAll(input.ArtifactFolder, 0o750)).To(Succeed())
		Expect(input.E2EConfig.Variables).To(HaveKey(capie2e.KubernetesVersion))
		Expect(input.E2EConfig.Variables).To(HaveKey(virshURIVariable),
			"%s pauses a guest with virsh: the e2e config must name the host's URI", specName)
		namespace, cancelWatches = framework.SetupSpecNamespace(ctx, specName, input.BootstrapClusterProxy, input.ArtifactFolder, nil)
		clusterResources = new(clusterctl.ApplyClusterTemplateAndWaitResult)
	})

	It("reboots an unhealthy worker, and has its MachineSet replace it when a reboot does not help", func() {
		By("Creating a workload cluster")
		clusterctl.ApplyClusterTemplateAndWait(ctx, clusterctl.ApplyClusterTemplateAndWaitInput{
			ClusterProxy: input.BootstrapClusterProxy,
			ConfigCluster: clusterctl.ConfigClusterInput{
				LogFolder:                filepath.Join(input.ArtifactFolder, "clusters", input.BootstrapClusterProxy.GetName()),
				ClusterctlConfigPath:     input.ClusterctlConfigPath,
				KubeconfigPath:           input.BootstrapClusterProxy.GetKubeconfigPath(),
				InfrastructureProvider:   clusterctl.DefaultInfrastructureProvider,
				Flavor:                   specName,
				Namespace:                namespace.Name,
				ClusterName:              fmt.Sprintf("%s-%s", specName, util.RandomString(6)),
				KubernetesVersion:        input.E2EConfig.MustGetVariable(capie2e.KubernetesVersion),
				ControlPlaneMachineCount: ptr.To[int64](1),
				WorkerMachineCount:       ptr.To[int64](1),
			},
			WaitForClusterIntervals:      input.E2EConfig.GetIntervals(specName, "wait-cluster"),
			WaitForControlPlaneIntervals: input.E2EConfig.GetIntervals(specName, "wait-control-plane"),
			WaitForMachineDeployments:    input.E2EConfig.GetIntervals(specName, "wait-worker-nodes"),
		}, clusterResources)

		cluster := clusterResources.Cluster
		Expect(clusterResources.MachineDeployments).To(HaveLen(1))
		md := clusterResources.MachineDeployments[0]
		management := input.BootstrapClusterProxy.GetClient()
		workload := input.BootstrapClusterProxy.GetWorkloadCluster(ctx, cluster.Namespace, cluster.Name).GetClient()
		uri := input.E2EConfig.MustGetVariable(virshURIVariable)
		rebootIntervals := input.E2EConfig.GetIntervals(specName, "wait-reboot-remediation")

		workers := mdMachines(ctx, Default, management, md)
		Expect(workers).To(HaveLen(1))
		worker := workers[0]
		Expect(worker.Status.NodeRef.IsDefined()).To(BeTrue(), "worker %s has no Node", worker.Name)
		infra := libvirtMachineOf(ctx, management, &worker)
		domain, _, _ := unstructured.NestedString(infra.Object, "status", "domainName")
		Expect(domain).NotTo(BeEmpty(), "LibvirtMachine %s has no status.domainName", infra.GetName())
		domainUUID := virsh(ctx, uri, "domuuid", domain)

		By(fmt.Sprintf("Pausing domain %s of worker %s: its kubelet stops and its Node turns Ready Unknown", domain, worker.Name))
		pausedAt := time.Now().Truncate(time.Second)
		virsh(ctx, uri, "suspend", domain)
		Expect(virsh(ctx, uri, "domstate", domain)).To(Equal("paused"))

		By("Waiting for the MachineHealthCheck's LibvirtRemediation and the provider's power cycle of the paused domain")
		var first *libvirtRemediation
		Eventually(func(g Gomega) {
			r, err := getRemediation(ctx, management, worker.Namespace, worker.Name)
			g.Expect(err).NotTo(HaveOccurred(), "LibvirtRemediation %s", worker.Name)
			g.Expect(r.Metadata.OwnerReferences).To(ContainElement(And(
				HaveField("Kind", "Machine"), HaveField("UID", worker.UID))), "not owned by Machine %s", worker.Name)
			g.Expect(r.Status.Phase).To(Equal("Waiting"))
			g.Expect(r.Status.RetryCount).To(BeEquivalentTo(1))
			g.Expect(r.Status.LastRemediated).NotTo(BeNil())
			g.Expect(r.Status.LastRemediated.Time).To(BeTemporally(">=", pausedAt))
			g.Expect(r.rebooted()).To(And(Not(BeNil()),
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "PowerCycled")))
			first = r
		}, rebootIntervals...).Should(Succeed())

		By("Waiting for the worker's Node to be Ready again and the MachineHealthCheck to delete the LibvirtRemediation")
		Eventually(func(g Gomega) {
			r, err := getRemediation(ctx, management, worker.Namespace, worker.Name)
			if err == nil && r.Status.Phase == "Failed" {
				StopTrying(fmt.Sprintf("the provider gave up on worker %s: its Node was not Ready within "+
					"timeoutSeconds of the reboot", worker.Name)).Now()
			}
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "LibvirtRemediation %s is still there (%v)", worker.Name, err)
			expectNodeReady(ctx, g, workload, worker.Status.NodeRef.Name)
		}, rebootIntervals...).Should(Succeed())

		By("Checking the worker is the same Machine, LibvirtMachine and domain, running")
		workers = mdMachines(ctx, Default, management, md)
		Expect(workers).To(HaveLen(1), "the MachineDeployment has more Machines than its worker")
		Expect(workers[0].UID).To(Equal(worker.UID), "worker %s was replaced", worker.Name)
		Expect(workers[0].Status.NodeRef.Name).To(Equal(worker.Status.NodeRef.Name))
		rebootedInfra := libvirtMachineOf(ctx, management, &workers[0])
		Expect(rebootedInfra.GetUID()).To(Equal(infra.GetUID()), "LibvirtMachine %s was replaced", infra.GetName())
		rebootedDomain, _, _ := unstructured.NestedString(rebootedInfra.Object, "status", "domainName")
		Expect(rebootedDomain).To(Equal(domain))
		Expect(virsh(ctx, uri, "domuuid", domain)).To(Equal(domainUUID))
		Expect(virsh(ctx, uri, "domstate", domain)).To(Equal("running"))
		framework.VerifyMachinesReady(ctx, framework.VerifyMachinesReadyInput{
			Lister:    management,
			Name:      cluster.Name,
			Namespace: cluster.Namespace,
		})

		By(fmt.Sprintf("Setting the condition e2e.remediation.condition False on Node %s: no kubelet clears it, so a reboot cannot help",
			worker.Status.NodeRef.Name))
		conditionSetAt := time.Now().Truncate(time.Second)
		framework.PatchNodeCondition(ctx, framework.PatchNodeConditionInput{
			ClusterProxy: input.BootstrapClusterProxy,
			Cluster:      cluster,
			NodeCondition: corev1.NodeCondition{
				Type:               "e2e.remediation.condition",
				Status:             corev1.ConditionFalse,
				LastTransitionTime: metav1.Now(),
			},
			Machine: workers[0],
		})

		By("Waiting for a new LibvirtRemediation and the provider's reset of the running domain")
		Eventually(func(g Gomega) {
			r, err := getRemediation(ctx, management, worker.Namespace, worker.Name)
			g.Expect(err).NotTo(HaveOccurred(), "LibvirtRemediation %s", worker.Name)
			g.Expect(r.Metadata.UID).NotTo(Equal(first.Metadata.UID), "still the first LibvirtRemediation")
			g.Expect(r.Status.Phase).To(Equal("Waiting"))
			g.Expect(r.Status.RetryCount).To(BeEquivalentTo(1))
			g.Expect(r.Status.LastRemediated).NotTo(BeNil())
			g.Expect(r.Status.LastRemediated.Time).To(BeTemporally(">=", conditionSetAt))
			g.Expect(r.rebooted()).To(And(Not(BeNil()),
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "Reset")))
		}, rebootIntervals...).Should(Succeed())

		// The provider gives up timeoutSeconds after the reset; the MachineSet
		// deletes the Machine at once, and the LibvirtRemediation goes with
		// it, so it shows Failed for a few seconds only: looked at often.
		By("Waiting for the provider to give up after timeoutSeconds: the LibvirtRemediation Failed, retries exhausted")
		Eventually(func(g Gomega) {
			r, err := getRemediation(ctx, management, worker.Namespace, worker.Name)
			if apierrors.IsNotFound(err) {
				StopTrying(fmt.Sprintf("LibvirtRemediation %s was gone before it was seen Failed", worker.Name)).Now()
			}
			g.Expect(err).NotTo(HaveOccurred(), "LibvirtRemediation %s", worker.Name)
			g.Expect(r.Status.Phase).To(Equal("Failed"))
			g.Expect(r.Status.RetryCount).To(BeEquivalentTo(1), "more than retryLimit reboots")
			g.Expect(r.rebooted()).To(And(Not(BeNil()),
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "RetriesExhausted")))
		}, input.E2EConfig.GetIntervals(specName, "wait-remediation-given-up")...).Should(Succeed())

		By(fmt.Sprintf("Waiting for the MachineSet to replace worker %s: the Machine, its LibvirtRemediation and domain gone, a new Machine with a Ready Node",
			worker.Name))
		Eventually(func(g Gomega) {
			err := management.Get(ctx, client.ObjectKeyFromObject(&worker), &clusterv1.Machine{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "Machine %s is still there (%v)", worker.Name, err)
			_, err = getRemediation(ctx, management, worker.Namespace, worker.Name)
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "LibvirtRemediation %s is still there (%v)", worker.Name, err)
			replacements := mdMachines(ctx, g, management, md)
			g.Expect(replacements).To(HaveLen(1))
			g.Expect(replacements[0].UID).NotTo(Equal(worker.UID))
			g.Expect(replacements[0].Status.NodeRef.IsDefined()).To(BeTrue(), "Machine %s has no Node yet", replacements[0].Name)
			expectNodeReady(ctx, g, workload, replacements[0].Status.NodeRef.Name)
		}, input.E2EConfig.GetIntervals(specName, "wait-machine-remediation")...).Should(Succeed())
		Expect(strings.Fields(virsh(ctx, uri, "list", "--all", "--name"))).NotTo(ContainElement(domain),
			"domain %s of the replaced worker is still on the host", domain)

		By("Checking the workload cluster: two Nodes, every one Ready, the old worker's gone")
		framework.WaitForNodesReady(ctx, framework.WaitForNodesReadyInput{
			Lister:            workload,
			KubernetesVersion: input.E2EConfig.MustGetVariable(capie2e.KubernetesVersion),
			Count:             2,
			WaitForNodesReady: input.E2EConfig.GetIntervals(specName, "wait-nodes-ready"),
		})
		framework.VerifyClusterAvailable(ctx, framework.VerifyClusterAvailableInput{
			Getter:    management,
			Name:      cluster.Name,
			Namespace: cluster.Namespace,
		})
		framework.VerifyMachinesReady(ctx, framework.VerifyMachinesReadyInput{
			Lister:    management,
			Name:      cluster.Name,
			Namespace: cluster.Namespace,
		})

		By("PASSED!")
	})

	AfterEach(func() {
		// Dumps every resource of the namespace, then deletes the cluster and the namespace.
		framework.DumpSpecResourcesAndCleanup(ctx, specName, input.BootstrapClusterProxy, input.ClusterctlConfigPath,
			input.ArtifactFolder, namespace, cancelWatches, clusterResources.Cluster, input.E2EConfig.GetIntervals, input.SkipCleanup)
	})
}

// mdMachines lists the Machines of MachineDeployment md, those being deleted included.
func mdMachines(ctx context.Context, g Gomega, c client.Client, md *clusterv1.MachineDeployment) []clusterv1.Machine {
	list := &clusterv1.MachineList{}
	g.Expect(c.List(ctx, list, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name})).To(Succeed())
	return list.Items
}

// libvirtMachineOf reads Machine m's LibvirtMachine.
func libvirtMachineOf(ctx context.Context, c client.Client, m *clusterv1.Machine) *unstructured.Unstructured {
	ref := m.Spec.InfrastructureRef
	object := &unstructured.Unstructured{}
	object.SetGroupVersionKind(schema.GroupVersionKind{Group: ref.APIGroup, Version: libvirtAPIVersion, Kind: ref.Kind})
	Expect(c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}, object)).To(Succeed(),
		"reading %s %s of Machine %s", ref.Kind, ref.Name, m.Name)
	return object
}

// getRemediation reads the LibvirtRemediation `name` (a NotFound error when there is none).
func getRemediation(ctx context.Context, c client.Client, namespace, name string) (*libvirtRemediation, error) {
	object := &unstructured.Unstructured{}
	object.SetGroupVersionKind(libvirtRemediationGVK)
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, object); err != nil {
		return nil, err
	}
	r := &libvirtRemediation{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(object.Object, r); err != nil {
		return nil, fmt.Errorf("reading LibvirtRemediation %s: %w", name, err)
	}
	return r, nil
}

// expectNodeReady expects Node `name` of the workload cluster to be Ready.
func expectNodeReady(ctx context.Context, g Gomega, workload client.Client, name string) {
	node := &corev1.Node{}
	g.Expect(workload.Get(ctx, client.ObjectKey{Name: name}, node)).To(Succeed(), "reading Node %s", name)
	g.Expect(node.Status.Conditions).To(ContainElement(And(
		HaveField("Type", corev1.NodeReady), HaveField("Status", corev1.ConditionTrue))), "Node %s is not Ready", name)
}

// virsh runs `virsh -q -c uri args...` on this machine and returns its
// output, trimmed: the host as an admin sees it.
func virsh(ctx context.Context, uri string, args ...string) string {
	command := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", uri}, args...)...)
	var stderr strings.Builder
	command.Stderr = &stderr
	out, err := command.Output()
	Expect(err).NotTo(HaveOccurred(), "virsh -c %s %s: %s", uri, strings.Join(args, " "), stderr.String())
	return strings.TrimSpace(string(out))
}
