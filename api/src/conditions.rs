//! Condition types and reasons, as the conditions table of the book's
//! troubleshooting page (`docs/src/troubleshooting.md`) lists them.

/// Summary condition on both kinds; CAPI mirrors the LibvirtCluster's into
/// the Cluster's InfrastructureReady.
pub const READY: &str = "Ready";
/// Both kinds: True when reconciliation is paused.
pub const PAUSED: &str = "Paused";

/// LibvirtCluster: a control plane endpoint is set.
pub const CONTROL_PLANE_ENDPOINT_READY: &str = "ControlPlaneEndpointReady";
/// LibvirtCluster: network and pools exist and are active.
/// LibvirtMachine: the cluster infrastructure is provisioned.
pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
/// LibvirtCluster with spec.hosts: every host's network and pools are ready
/// (False lists the hosts that are not; machines go to the others).
pub const HOSTS_READY: &str = "HostsReady";
/// LibvirtMachine: the domain is being created, or creation failed.
pub const DOMAIN_PROVISIONING_READY: &str = "DomainProvisioningReady";
/// LibvirtMachine: the domain was created.
pub const MACHINE_CREATED: &str = "MachineCreated";
/// LibvirtMachine: the domain is running.
pub const DOMAIN_RUNNING: &str = "DomainRunning";

/// LibvirtRemediation: the Machine's domain was rebooted (False: the
/// reboot failed, could not be attempted, or the provider gave up).
pub const REBOOTED: &str = "Rebooted";

/// Every condition type per kind, in the order the book's conditions table
/// lists them.
pub const CLUSTER_CONDITIONS: &[&str] =
    &[CONTROL_PLANE_ENDPOINT_READY, INFRASTRUCTURE_READY, HOSTS_READY, READY, PAUSED];
pub const MACHINE_CONDITIONS: &[&str] =
    &[INFRASTRUCTURE_READY, DOMAIN_PROVISIONING_READY, MACHINE_CREATED, DOMAIN_RUNNING, READY, PAUSED];
pub const REMEDIATION_CONDITIONS: &[&str] = &[REBOOTED];

/// Reasons.
pub mod reasons {
    // Common CAPI reasons.
    pub const READY: &str = "Ready";
    pub const NOT_READY: &str = "NotReady";
    pub const READY_UNKNOWN: &str = "ReadyUnknown";
    pub const PAUSED: &str = "Paused";
    pub const NOT_PAUSED: &str = "NotPaused";
    pub const DELETING: &str = "Deleting";
    /// LibvirtMachine Ready: removing the machine from the host failed (e.g.
    /// the host does not answer); it is retried with a growing interval.
    pub const DELETION_RETRYING: &str = "DeletionRetrying";
    pub const INTERNAL_ERROR: &str = "InternalError";
    pub const PROVISIONED: &str = "Provisioned";
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE_READY: &str = "WaitingForClusterInfrastructureReady";
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";

    // LibvirtCluster.
    pub const CONTROL_PLANE_ENDPOINT_SET: &str = "ControlPlaneEndpointSet";
    pub const WAITING_FOR_CONTROL_PLANE_ENDPOINT: &str = "WaitingForControlPlaneEndpoint";
    pub const INFRASTRUCTURE_AVAILABLE: &str = "InfrastructureAvailable";
    pub const INFRASTRUCTURE_MISSING: &str = "InfrastructureMissing";
    pub const INFRASTRUCTURE_INACTIVE: &str = "InfrastructureInactive";
    pub const INFRASTRUCTURE_PROVISIONING_FAILED: &str = "InfrastructureProvisioningFailed";
    /// The network or a pool is of a kind the provider cannot use (no IPv4;
    /// a pool type other than dir, fs or netfs).
    pub const INFRASTRUCTURE_UNSUPPORTED: &str = "InfrastructureUnsupported";
    /// spec.hosts names no host, or two hosts share a name or a URI.
    pub const INVALID_HOSTS: &str = "InvalidHosts";
    /// HostsReady: every listed host is ready.
    pub const HOSTS_AVAILABLE: &str = "HostsAvailable";
    /// HostsReady: some listed hosts failed their check.
    pub const HOSTS_DEGRADED: &str = "HostsDegraded";

    // LibvirtMachine.
    pub const WAITING_FOR_OWNER: &str = "WaitingForOwner";
    pub const DOMAIN_PROVISIONING: &str = "DomainProvisioning";
    pub const DOMAIN_PROVISIONED: &str = "DomainProvisioned";
    pub const DOMAIN_CREATED: &str = "DomainCreated";
    pub const DOMAIN_NOT_CREATED: &str = "DomainNotCreated";
    pub const DOMAIN_RUNNING: &str = "DomainRunning";
    pub const DOMAIN_NOT_RUNNING: &str = "DomainNotRunning";
    /// The domain of a provisioned machine no longer exists on the host; it is
    /// not created again (that would run the bootstrap data twice).
    pub const DOMAIN_LOST: &str = "DomainLost";
    pub const DOMAIN_NAME_COLLISION: &str = "DomainNameCollision";
    pub const INVALID_BOOTSTRAP_DATA: &str = "InvalidBootstrapData";
    pub const HOST_UNREACHABLE: &str = "HostUnreachable";
    /// The LibvirtMachine asks for something the host cannot give (e.g. a disk smaller than its image).
    pub const INVALID_MACHINE_SPEC: &str = "InvalidMachineSpec";
    /// An IPAddressClaim of the machine (spec.addressesFromPools) has no address yet; retried.
    pub const WAITING_FOR_IP_ADDRESS: &str = "WaitingForIPAddress";
    /// The in-cluster IPAM pool named in spec.addressesFromPools does not exist; retried.
    pub const IP_ADDRESS_POOL_NOT_FOUND: &str = "IPAddressPoolNotFound";
    /// The in-cluster IPAM pool has no free address; retried.
    pub const IP_ADDRESS_POOL_EXHAUSTED: &str = "IPAddressPoolExhausted";
    /// The IPAddress bound to a claim of the machine is not a usable address.
    pub const INVALID_IP_ADDRESS: &str = "InvalidIPAddress";
    /// No host of the LibvirtCluster may run the machine and has the memory for it; retried.
    pub const NO_HOST_FITS: &str = "NoHostFits";
    /// The Machine's spec.failureDomain names no host of the LibvirtCluster
    /// (or a host that takes no control-plane machines, for one that is).
    pub const FAILURE_DOMAIN_NOT_FOUND: &str = "FailureDomainNotFound";
    /// A volume or DHCP entry with our name exists on the host but is not ours.
    pub const OBJECT_COLLISION: &str = "ObjectCollision";
    /// The LibvirtCluster's URI would make the manager run a program, read a
    /// file or skip the server's identity check, and the manager does not
    /// allow that (`--allow-unsafe-uris`).
    pub const URI_NOT_ALLOWED: &str = "UriNotAllowed";
    /// Both kinds: the Secret named by the LibvirtCluster's credentialsRef
    /// does not exist (yet); retried.
    pub const CREDENTIALS_NOT_FOUND: &str = "CredentialsNotFound";
    /// Both kinds: the credentialsRef Secret lacks keys the URI's transport
    /// needs, or the URI cannot take credentials from a Secret.
    pub const INVALID_CREDENTIALS: &str = "InvalidCredentials";
    /// Both kinds: the host or the client refused the credentials (a
    /// certificate, a key, an unknown host key); retried after a fix.
    pub const HOST_AUTHENTICATION_FAILED: &str = "HostAuthenticationFailed";
    /// LibvirtMachine (DomainProvisioningReady): the base image of
    /// spec.imageURL is being downloaded into the host's basePool; the
    /// message says how far.
    pub const DOWNLOADING_IMAGE: &str = "DownloadingImage";
    /// LibvirtMachine: the download of spec.imageURL failed (the server's
    /// answer, a timeout, the size limit, or a body that is not the image);
    /// retried.
    pub const IMAGE_DOWNLOAD_FAILED: &str = "ImageDownloadFailed";
    /// LibvirtMachine: the downloaded image does not have spec.imageURL's
    /// checksum; retried.
    pub const IMAGE_CHECKSUM_MISMATCH: &str = "ImageChecksumMismatch";
    /// LibvirtMachine: the downloaded body is not an image of
    /// spec.imageURL's format; retried.
    pub const IMAGE_FORMAT_MISMATCH: &str = "ImageFormatMismatch";

    // LibvirtRemediation (Rebooted).
    /// A running domain was reset (virDomainReset).
    pub const RESET: &str = "Reset";
    /// A domain that was paused, crashed or whose reset failed was destroyed and started.
    pub const POWER_CYCLED: &str = "PowerCycled";
    /// A shut-off domain was started.
    pub const STARTED: &str = "Started";
    /// The host refused or did not answer the reboot; the next attempt counts against retryLimit.
    pub const REBOOT_FAILED: &str = "RebootFailed";
    /// The LibvirtRemediation has no owner Machine, or the Machine no LibvirtMachine.
    pub const MACHINE_NOT_FOUND: &str = "MachineNotFound";
    /// The Machine's domain is not on its host: a reboot cannot help; the Machine is handed to its owner.
    pub const DOMAIN_NOT_FOUND: &str = "DomainNotFound";
    /// retryLimit reboots did not make the Machine healthy; it is handed to its owner for replacement.
    pub const RETRIES_EXHAUSTED: &str = "RetriesExhausted";
}
