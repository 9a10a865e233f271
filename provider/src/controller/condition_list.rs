//! Setting `metav1.Condition`s the way CAPI expects: one entry per type,
//! `lastTransitionTime` moving only when the status changes, and
//! `observedGeneration` stamped on every write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A condition's status, as the three strings the API uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    pub fn from_bool(value: bool) -> Self {
        if value { Status::True } else { Status::False }
    }
}

/// What a reconcile wants one condition to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    pub type_: &'static str,
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

/// The longest condition message written, in characters. A condition's
/// message may carry text from a host (a libvirt error, a guest's console)
/// that has no bound of its own; CAPI copies it into the Machine's
/// conditions, and an over-long message would make that write, or ours, fail.
pub const MAX_MESSAGE_CHARS: usize = 10_240;

/// `message` cut to [`MAX_MESSAGE_CHARS`], saying that it was cut.
fn bounded(message: String) -> String {
    const CUT: &str = " ... (truncated)";
    if message.chars().count() <= MAX_MESSAGE_CHARS {
        return message;
    }
    let mut out: String = message.chars().take(MAX_MESSAGE_CHARS - CUT.len()).collect();
    out.push_str(CUT);
    out
}

impl ConditionUpdate {
    pub fn new(type_: &'static str, status: Status, reason: &'static str, message: impl Into<String>) -> Self {
        Self { type_, status, reason, message: bounded(message.into()) }
    }

    pub fn true_(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(type_, Status::True, reason, message)
    }

    pub fn false_(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(type_, Status::False, reason, message)
    }

    pub fn unknown(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(type_, Status::Unknown, reason, message)
    }
}

/// Applies `updates` to `conditions` in place.
pub fn apply(conditions: &mut Vec<Condition>, updates: &[ConditionUpdate], generation: Option<i64>, now: Timestamp) {
    for update in updates {
        let status = update.status.as_str();
        match conditions.iter_mut().find(|c| c.type_ == update.type_) {
            Some(existing) => {
                if existing.status != status {
                    existing.last_transition_time = Time(now);
                }
                existing.status = status.to_string();
                existing.reason = update.reason.to_string();
                existing.message = update.message.clone();
                existing.observed_generation = generation;
            }
            None => conditions.push(Condition {
                type_: update.type_.to_string(),
                status: status.to_string(),
                reason: update.reason.to_string(),
                message: update.message.clone(),
                observed_generation: generation,
                last_transition_time: Time(now),
            }),
        }
    }
}

/// The status of `type_` in `conditions`, if present.
pub fn status_of(conditions: &[Condition], type_: &str) -> Option<Status> {
    conditions.iter().find(|c| c.type_ == type_).map(|c| match c.status.as_str() {
        "True" => Status::True,
        "False" => Status::False,
        _ => Status::Unknown,
    })
}

/// The Ready summary of a set of updates: True when every one of `types` is
/// True, otherwise the first that is not, with its reason and message.
pub fn summary(updates: &[ConditionUpdate], types: &[&str]) -> ConditionUpdate {
    use crate::api::conditions::{READY, reasons};
    for type_ in types {
        match updates.iter().find(|u| u.type_ == *type_) {
            Some(u) if u.status == Status::True => {}
            Some(u) => {
                let reason = if u.status == Status::Unknown { reasons::READY_UNKNOWN } else { reasons::NOT_READY };
                let message = if u.message.is_empty() {
                    format!("{} is {}", u.type_, u.status.as_str())
                } else {
                    u.message.clone()
                };
                return ConditionUpdate::new(READY, u.status, reason, message);
            }
            None => {
                return ConditionUpdate::unknown(READY, reasons::READY_UNKNOWN, format!("{type_} is not reported yet"));
            }
        }
    }
    ConditionUpdate::true_(READY, reasons::READY, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let mut list = Vec::new();
        apply(&mut list, &[ConditionUpdate::false_("DomainRunning", "DomainNotRunning", "shutoff")], Some(1), at(100));
        apply(&mut list, &[ConditionUpdate::false_("DomainRunning", "DomainNotRunning", "paused")], Some(2), at(200));
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].last_transition_time, Time(at(100)));
        assert_eq!(list[0].message, "paused");
        assert_eq!(list[0].observed_generation, Some(2));
        apply(&mut list, &[ConditionUpdate::true_("DomainRunning", "DomainRunning", "")], Some(2), at(300));
        assert_eq!(list[0].last_transition_time, Time(at(300)));
        assert_eq!(status_of(&list, "DomainRunning"), Some(Status::True));
    }

    #[test]
    fn a_long_message_is_cut_and_says_so() {
        let long = "é".repeat(MAX_MESSAGE_CHARS + 1);
        let update = ConditionUpdate::false_("HostReachable", "HostUnreachable", long);
        assert_eq!(update.message.chars().count(), MAX_MESSAGE_CHARS);
        assert!(update.message.ends_with(" ... (truncated)") && update.message.starts_with("éé"));
        let exact = "x".repeat(MAX_MESSAGE_CHARS);
        assert_eq!(ConditionUpdate::false_("A", "B", exact.clone()).message, exact);
    }

    #[test]
    fn summary_names_the_first_condition_that_is_not_true() {
        let updates = [
            ConditionUpdate::true_("A", "Fine", ""),
            ConditionUpdate::false_("B", "Broken", "pool gone"),
            ConditionUpdate::unknown("C", "Unknown", ""),
        ];
        let ready = summary(&updates, &["A", "B", "C"]);
        assert_eq!((ready.status, ready.reason, ready.message.as_str()), (Status::False, "NotReady", "pool gone"));
        let ready = summary(&updates, &["A", "C"]);
        assert_eq!((ready.status, ready.reason), (Status::Unknown, "ReadyUnknown"));
        assert_eq!(summary(&updates, &["A"]).status, Status::True);
    }
}
