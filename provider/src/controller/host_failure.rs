//! The one place where a host failure becomes a condition reason: the host
//! layer (`capl-host`) says what kind of failure it met ([`FailureKind`]);
//! which reason the API reports for it is the controllers' business.

use capl_host::FailureKind;

use crate::api::conditions::reasons;

/// The LibvirtMachine's DomainProvisioningReady reason for a host failure.
pub fn machine_reason(kind: FailureKind) -> &'static str {
    match kind {
        FailureKind::InfrastructureMissing => reasons::INFRASTRUCTURE_MISSING,
        FailureKind::InfrastructureInactive => reasons::INFRASTRUCTURE_INACTIVE,
        FailureKind::InfrastructureUnsupported => reasons::INFRASTRUCTURE_UNSUPPORTED,
        FailureKind::ProvisioningFailed => reasons::INFRASTRUCTURE_PROVISIONING_FAILED,
        FailureKind::InvalidMachineSpec => reasons::INVALID_MACHINE_SPEC,
        FailureKind::DomainCollision => reasons::DOMAIN_NAME_COLLISION,
        FailureKind::ObjectCollision => reasons::OBJECT_COLLISION,
        FailureKind::HostUnreachable => reasons::HOST_UNREACHABLE,
        FailureKind::AuthenticationFailed => reasons::HOST_AUTHENTICATION_FAILED,
    }
}

/// The LibvirtCluster's InfrastructureReady reason for a host failure: the
/// four of the conditions table in the book's troubleshooting page (missing,
/// inactive, unsupported, anything else), and
/// refused credentials, which the user fixes in the Secret.
pub fn cluster_reason(kind: FailureKind) -> &'static str {
    match kind {
        FailureKind::InfrastructureMissing => reasons::INFRASTRUCTURE_MISSING,
        FailureKind::InfrastructureInactive => reasons::INFRASTRUCTURE_INACTIVE,
        FailureKind::InfrastructureUnsupported => reasons::INFRASTRUCTURE_UNSUPPORTED,
        FailureKind::AuthenticationFailed => reasons::HOST_AUTHENTICATION_FAILED,
        FailureKind::ProvisioningFailed
        | FailureKind::InvalidMachineSpec
        | FailureKind::DomainCollision
        | FailureKind::ObjectCollision
        | FailureKind::HostUnreachable => reasons::INFRASTRUCTURE_PROVISIONING_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_reports_the_infrastructure_reasons_and_refused_credentials() {
        for kind in FailureKind::ALL {
            let reason = cluster_reason(kind);
            assert!(
                [
                    reasons::INFRASTRUCTURE_MISSING,
                    reasons::INFRASTRUCTURE_INACTIVE,
                    reasons::INFRASTRUCTURE_UNSUPPORTED,
                    reasons::INFRASTRUCTURE_PROVISIONING_FAILED,
                    reasons::HOST_AUTHENTICATION_FAILED
                ]
                .contains(&reason),
                "{kind:?} -> {reason}"
            );
        }
    }

    #[test]
    fn every_machine_failure_has_its_own_reason() {
        let reasons: std::collections::HashSet<_> = FailureKind::ALL.into_iter().map(machine_reason).collect();
        assert_eq!(reasons.len(), FailureKind::ALL.len());
    }
}
