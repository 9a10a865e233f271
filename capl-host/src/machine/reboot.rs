//! Rebooting a machine's domain, for remediation: the guest starts again from
//! its disks, whatever state it was stuck in.
//!
//! A running guest is reset (`virDomainReset`): the quickest way back, in the
//! same QEMU process. A reset leaves a paused domain paused and a crashed one
//! paused, so a domain in any other active state is destroyed and started
//! instead (a power cycle), as is a running one whose reset failed. A
//! shut-off domain is started. Either way the guest's disks are as after a
//! power cut: nothing asks the guest to shut down first, since a machine that
//! needs remediation cannot be trusted to.

use crate::error::{HostResult, ObjectKind};
use crate::hypervisor::{DomainState, ErrorKind, Hypervisor};

use super::{MachineRun, MachineSpec};

/// How [`reboot_machine`] brought the guest back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RebootMethod {
    /// `virDomainReset` of a running domain: same QEMU process, same domain id.
    Reset,
    /// `virDomainDestroy`, then `virDomainCreate`: a new QEMU process.
    PowerCycle,
    /// `virDomainCreate` of a shut-off domain.
    Start,
}

/// What [`reboot_machine`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reboot {
    pub method: RebootMethod,
    /// The domain's state before the reboot.
    pub was: DomainState,
    /// When the reset of a running domain failed and it was power-cycled
    /// instead: the reset's error (libvirt's message and number).
    pub reset_error: Option<String>,
}

impl Reboot {
    /// A short text for people: "reset (was running)", "destroyed and started
    /// (was paused)", "started (was shut off)", "destroyed and started after
    /// the reset failed: <libvirt's error>".
    pub fn describe(&self) -> String {
        let was = state_text(self.was);
        match (self.method, &self.reset_error) {
            (RebootMethod::Reset, _) => format!("reset (was {was})"),
            (RebootMethod::PowerCycle, Some(error)) => format!("destroyed and started after the reset failed: {error}"),
            (RebootMethod::PowerCycle, None) => format!("destroyed and started (was {was})"),
            (RebootMethod::Start, _) => format!("started (was {was})"),
        }
    }
}

/// A domain state in words.
fn state_text(state: DomainState) -> &'static str {
    match state {
        DomainState::NoState => "in no state",
        DomainState::Running => "running",
        DomainState::Blocked => "blocked",
        DomainState::Paused => "paused",
        DomainState::Shutdown => "shutting down",
        DomainState::Shutoff => "shut off",
        DomainState::Crashed => "crashed",
        DomainState::PmSuspended => "suspended by the guest",
    }
}

/// Reboots the machine's domain: resets it when it runs (running or
/// blocked), destroys and starts it when it is paused, suspended by the
/// guest, crashed, shutting down or in no state, or when its reset failed,
/// and starts it when it is shut off. Nothing is asked of the guest: its
/// disks are as after a power cut.
///
/// `None` when the domain does not exist (or vanished during the reboot). A
/// domain at the machine's name that is not the machine's is a collision
/// and is not touched. A call that fails because the connection is lost is
/// not retried another way: the caller retries on a new connection.
///
/// Libvirt calls: domain XML and state, then the reset (3 in all), or
/// destroy and start (4), or start (3).
pub fn reboot_machine(hv: &dyn Hypervisor, spec: &MachineSpec) -> HostResult<Option<Reboot>> {
    let run = MachineRun::new(hv, spec)?;
    if run.owned_domain()?.is_none() {
        return Ok(None);
    }
    let domain = run.names.domain.as_str();
    let was = match hv.domain_state(domain) {
        Ok(state) => state,
        Err(e) if e.kind == ErrorKind::NoDomain => return Ok(None),
        Err(e) => return Err(run.error("read the state of", ObjectKind::Domain, domain, e)),
    };
    let (method, reset_error) = match was {
        DomainState::Running | DomainState::Blocked => match hv.domain_reset(domain) {
            Ok(()) => (RebootMethod::Reset, None),
            Err(e) if e.kind == ErrorKind::NoDomain => return Ok(None),
            // Another way over the same connection would fail the same way.
            Err(e) if e.kind == ErrorKind::ConnectionLost => {
                return Err(run.error("reset", ObjectKind::Domain, domain, e));
            }
            // E.g. the guest stopped after the state was read, or QEMU refused.
            Err(e) => (RebootMethod::PowerCycle, Some(e.to_string())),
        },
        DomainState::Shutoff => (RebootMethod::Start, None),
        // A reset would leave a paused (or crashed) domain paused.
        DomainState::Paused
        | DomainState::PmSuspended
        | DomainState::Crashed
        | DomainState::Shutdown
        | DomainState::NoState => (RebootMethod::PowerCycle, None),
    };
    if method == RebootMethod::PowerCycle {
        match hv.domain_destroy(domain) {
            Ok(()) => {}
            Err(e) if e.kind == ErrorKind::NoDomain => return Ok(None),
            // Stopped already (on its own, or by someone else).
            Err(e) if e.kind == ErrorKind::OperationInvalid => {}
            Err(e) => return Err(run.error("destroy", ObjectKind::Domain, domain, e)),
        }
    }
    if method != RebootMethod::Reset {
        match hv.domain_start(domain) {
            Ok(()) => {}
            Err(e) if e.kind == ErrorKind::NoDomain => return Ok(None),
            // Started by someone else meanwhile: running again, as asked.
            Err(e)
                if e.kind == ErrorKind::OperationInvalid
                    && hv.domain_state(domain).is_ok_and(|state| state == DomainState::Running) => {}
            Err(e) => return Err(run.start_failed(e)),
        }
    }
    Ok(Some(Reboot { method, was, reset_error }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reboot_describes_itself() {
        let reboot = |method, was, reset_error: Option<&str>| Reboot {
            method,
            was,
            reset_error: reset_error.map(str::to_string),
        };
        assert_eq!(reboot(RebootMethod::Reset, DomainState::Running, None).describe(), "reset (was running)");
        assert_eq!(
            reboot(RebootMethod::PowerCycle, DomainState::Paused, None).describe(),
            "destroyed and started (was paused)"
        );
        assert_eq!(reboot(RebootMethod::Start, DomainState::Shutoff, None).describe(), "started (was shut off)");
        assert_eq!(
            reboot(RebootMethod::PowerCycle, DomainState::Running, Some("QEMU said no (libvirt error 1)")).describe(),
            "destroyed and started after the reset failed: QEMU said no (libvirt error 1)"
        );
    }
}
