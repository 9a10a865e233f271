// Package capi runs Cluster API's own end-to-end specs
// (sigs.k8s.io/cluster-api/test/e2e) against this provider. It is glue only:
// `capl-e2e capi` (run by `cargo xtask e2e capi`) makes the management cluster
// (kind, cert-manager, CAPI core, the kubeadm providers and this provider
// installed by clusterctl init), the libvirt host and the e2e config, then
// runs this test binary with the flags below.
package capi

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"sigs.k8s.io/cluster-api/test/framework"
	"sigs.k8s.io/cluster-api/test/framework/clusterctl"
)

var (
	configPath     string
	artifactFolder string
	kubeconfigPath string
	skipCleanup    bool

	ctx = context.Background()

	e2eConfig             *clusterctl.E2EConfig
	clusterctlConfigPath  string
	bootstrapClusterProxy framework.ClusterProxy
)

func init() {
	flag.StringVar(&configPath, "e2e.config", "", "the e2e config file (written by capl-e2e capi)")
	flag.StringVar(&artifactFolder, "e2e.artifacts-folder", "", "where the specs keep their logs and resource dumps")
	flag.StringVar(&kubeconfigPath, "e2e.kubeconfig", "", "the kubeconfig of the management cluster, with every provider installed")
	flag.BoolVar(&skipCleanup, "e2e.skip-resource-cleanup", false, "keep each spec's workload cluster")
}

func TestE2E(t *testing.T) {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	RegisterFailHandler(Fail)
	RunSpecs(t, "cluster-api-provider-libvirt: Cluster API's e2e specs")
}

var _ = BeforeSuite(func() {
	Expect(configPath).To(BeAnExistingFile(), "-e2e.config must name the e2e config file")
	Expect(kubeconfigPath).To(BeAnExistingFile(), "-e2e.kubeconfig must name the management cluster's kubeconfig")
	Expect(artifactFolder).NotTo(BeEmpty(), "-e2e.artifacts-folder is required")
	Expect(os.MkdirAll(artifactFolder, 0o750)).To(Succeed())

	e2eConfig = clusterctl.LoadE2EConfig(ctx, clusterctl.LoadE2EConfigInput{ConfigPath: configPath})
	clusterctlConfigPath = clusterctl.CreateRepository(ctx, clusterctl.CreateRepositoryInput{
		E2EConfig:        e2eConfig,
		RepositoryFolder: filepath.Join(artifactFolder, "repository"),
	})

	scheme := runtime.NewScheme()
	framework.TryAddDefaultSchemes(scheme)
	bootstrapClusterProxy = framework.NewClusterProxy(e2eConfig.ManagementClusterName, kubeconfigPath, scheme)

	// The providers are installed already: this finds their Deployments,
	// skips clusterctl init and keeps the controllers' logs in the artifacts.
	clusterctl.InitManagementClusterAndWatchControllerLogs(ctx, clusterctl.InitManagementClusterAndWatchControllerLogsInput{
		ClusterProxy:            bootstrapClusterProxy,
		ClusterctlConfigPath:    clusterctlConfigPath,
		InfrastructureProviders: e2eConfig.InfrastructureProviders(),
		LogFolder:               filepath.Join(artifactFolder, "clusters", bootstrapClusterProxy.GetName()),
	}, e2eConfig.GetIntervals(bootstrapClusterProxy.GetName(), "wait-controllers")...)
})

var _ = AfterSuite(func() {
	if bootstrapClusterProxy != nil {
		bootstrapClusterProxy.Dispose(ctx)
	}
})
