package capi

import (
	. "github.com/onsi/ginkgo/v2"
	"k8s.io/utils/ptr"

	capie2e "sigs.k8s.io/cluster-api/test/e2e"
)

// Each Describe carries one label, the spec's name in `cargo xtask e2e capi
// --focus NAME` and in its table.

// quickStart is QuickStartSpec's input with the flavor `flavor` (nil: the default).
func quickStart(flavor *string) func() capie2e.QuickStartSpecInput {
	return func() capie2e.QuickStartSpecInput {
		return capie2e.QuickStartSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			Flavor:                flavor,
		}
	}
}

var _ = Describe("quick-start", Label("quick-start"), func() {
	capie2e.QuickStartSpec(ctx, quickStart(nil))
})

var _ = Describe("quick-start with a ClusterClass", Label("quick-start-topology"), func() {
	capie2e.QuickStartSpec(ctx, quickStart(ptr.To("topology")))
})

var _ = Describe("md-remediation", Label("md-remediation"), func() {
	capie2e.MachineDeploymentRemediationSpec(ctx, func() capie2e.MachineDeploymentRemediationSpecInput {
		return capie2e.MachineDeploymentRemediationSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
		}
	})
})

var _ = Describe("md-scale", Label("md-scale"), func() {
	capie2e.MachineDeploymentScaleSpec(ctx, func() capie2e.MachineDeploymentScaleSpecInput {
		return capie2e.MachineDeploymentScaleSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
		}
	})
})

// md-rollout: upstream names it after KubeadmControlPlane and MachineDeployment
// (it was MachineDeploymentRolloutSpec before taints were added to it).
var _ = Describe("md-rollout", Label("md-rollout"), func() {
	capie2e.KCPAndMachineDeploymentRolloutSpec(ctx, func() capie2e.KCPAndMachineDeploymentRolloutSpecInput {
		return capie2e.KCPAndMachineDeploymentRolloutSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
			Flavor:                "kcp-md-taints",
		}
	})
})

// quick-start-data-disks: QuickStartSpec with the data-disks flavor, whose
// control-plane machines keep etcd on a data disk; once the machines are up,
// each control-plane node's cloud-init log shows the file system made on that
// disk and the mount that put it under etcd's data directory.
var _ = Describe("quick-start with data disks", Label("quick-start-data-disks"), func() {
	capie2e.QuickStartSpec(ctx, func() capie2e.QuickStartSpecInput {
		input := quickStart(ptr.To("data-disks"))()
		input.PostMachinesProvisioned = etcdDiskMounted
		return input
	})
})

// remediation-reboot: the provider's remediation by reboot, a
// LibvirtRemediationTemplate in a MachineHealthCheck of the workers
// (remediation_reboot_test.go): a worker whose guest was paused is rebooted
// and stays the same Machine; a worker whose Node condition a reboot cannot
// clear is rebooted once, then replaced by its MachineSet.
var _ = Describe("remediation-reboot", Label("remediation-reboot"), func() {
	remediationRebootSpec(ctx, func() remediationRebootSpecInput {
		return remediationRebootSpecInput{
			E2EConfig:             e2eConfig,
			ClusterctlConfigPath:  clusterctlConfigPath,
			BootstrapClusterProxy: bootstrapClusterProxy,
			ArtifactFolder:        artifactFolder,
			SkipCleanup:           skipCleanup,
		}
	})
})
