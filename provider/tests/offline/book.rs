//! The book's tables say what the code does: each test reads the page that
//! holds its table (`docs/src/<page>.md`).

use std::collections::BTreeSet;
use std::path::Path;

use capl::api::conditions;

/// The book's pages that hold the tables checked here.
const INTRODUCTION: &str = "introduction.md";
const TROUBLESHOOTING: &str = "troubleshooting.md";
const DESIGN: &str = "design.md";
const OPERATIONS: &str = "operations.md";

fn page(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Rows of the table of book page `name` whose header starts with `header`.
fn table_rows(name: &str, header: &str) -> Vec<Vec<String>> {
    let text = page(name);
    let mut lines = text.lines().skip_while(|l| !l.starts_with(header));
    lines.next().unwrap_or_else(|| panic!("{name} has no table starting with {header:?}"));
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

#[test]
fn conditions_table_matches_the_constants() {
    let rows = table_rows(TROUBLESHOOTING, "| Resource | Condition | Meaning |");
    for (kind, constants) in [
        ("LibvirtCluster", conditions::CLUSTER_CONDITIONS),
        ("LibvirtMachine", conditions::MACHINE_CONDITIONS),
        ("LibvirtRemediation", conditions::REMEDIATION_CONDITIONS),
    ] {
        let documented: BTreeSet<&str> = rows.iter().filter(|r| r[0] == kind).map(|r| r[1].as_str()).collect();
        let code: BTreeSet<&str> = constants.iter().copied().collect();
        assert_eq!(documented, code, "the book's conditions of {kind} differ from the code");
    }
    let infra = rows.iter().find(|r| r[0] == "LibvirtCluster" && r[1] == conditions::INFRASTRUCTURE_READY).unwrap();
    for reason in [
        conditions::reasons::INFRASTRUCTURE_MISSING,
        conditions::reasons::INFRASTRUCTURE_INACTIVE,
        conditions::reasons::INFRASTRUCTURE_PROVISIONING_FAILED,
        conditions::reasons::URI_NOT_ALLOWED,
        conditions::reasons::CREDENTIALS_NOT_FOUND,
        conditions::reasons::INVALID_CREDENTIALS,
        conditions::reasons::HOST_AUTHENTICATION_FAILED,
    ] {
        assert!(infra[2].contains(reason), "the conditions table does not list reason {reason}");
    }
}

#[test]
fn kinds_table_lists_every_crd() {
    let documented: BTreeSet<String> =
        table_rows(INTRODUCTION, "| Kind | Purpose |").into_iter().map(|r| r[0].clone()).collect();
    let code: BTreeSet<String> = capl::api::crds().into_iter().map(|c| c.spec.names.kind).collect();
    assert_eq!(documented, code);
}

#[test]
fn names_table_example_is_what_the_code_computes() {
    let rows = table_rows(DESIGN, "| Item | Value |");
    let domain = rows.iter().find(|r| r[0] == "Domain name").expect("the names table has a Domain name row");
    // The table's example: LibvirtMachine default/libvirt-xd-0 with the identity it shows.
    let identity = rows.iter().find(|r| r[0] == "Identity").expect("the names table has an Identity row");
    let uuid =
        identity[1].split('`').find(|s| capl_host::naming::is_uuid(s)).expect("the Identity row shows an example UUID");
    let example = capl_host::naming::domain_name("default", "libvirt-xd-0", uuid);
    assert!(domain[1].contains(&format!("`{example}`")), "the book says {:?}, the code computes {example}", domain[1]);
    let provider_id = rows.iter().find(|r| r[0] == "Provider ID").unwrap();
    assert!(provider_id[1].starts_with(&format!("`{}", capl_host::naming::PROVIDER_ID_PREFIX)));
}

#[test]
fn machine_failure_reasons_are_documented() {
    let rows = table_rows(TROUBLESHOOTING, "| Resource | Condition | Meaning |");
    let row = rows.iter().find(|r| r[0] == "LibvirtMachine" && r[1] == conditions::DOMAIN_PROVISIONING_READY).unwrap();
    for kind in capl_host::FailureKind::ALL {
        let reason = capl::controller::host_failure::machine_reason(kind);
        assert!(row[2].contains(reason), "the conditions table does not list reason {reason} (host failure {kind:?})");
    }
    for reason in [
        conditions::reasons::WAITING_FOR_BOOTSTRAP_DATA,
        conditions::reasons::INVALID_BOOTSTRAP_DATA,
        conditions::reasons::DOMAIN_PROVISIONING,
        conditions::reasons::DOMAIN_NAME_COLLISION,
        conditions::reasons::INVALID_MACHINE_SPEC,
        conditions::reasons::OBJECT_COLLISION,
        conditions::reasons::URI_NOT_ALLOWED,
        conditions::reasons::CREDENTIALS_NOT_FOUND,
        conditions::reasons::INVALID_CREDENTIALS,
    ] {
        assert!(row[2].contains(reason), "the conditions table does not list reason {reason}");
    }
}

#[test]
fn lost_domain_reason_is_documented() {
    let rows = table_rows(TROUBLESHOOTING, "| Resource | Condition | Meaning |");
    for type_ in [conditions::MACHINE_CREATED, conditions::DOMAIN_RUNNING, conditions::READY] {
        let row = rows.iter().find(|r| r[0] == "LibvirtMachine" && r[1] == type_).unwrap();
        assert!(row[2].contains(conditions::reasons::DOMAIN_LOST), "conditions row {type_} lacks DomainLost");
    }
}

#[test]
fn deletion_reason_and_annotation_are_documented() {
    let rows = table_rows(TROUBLESHOOTING, "| Resource | Condition | Meaning |");
    let row = rows.iter().find(|r| r[0] == "LibvirtMachine" && r[1] == conditions::READY).unwrap();
    assert!(row[2].contains(conditions::reasons::DELETION_RETRYING), "conditions Ready row lacks DeletionRetrying");
    let text = page(TROUBLESHOOTING);
    let section = text
        .split("### Deleting objects in any order")
        .nth(1)
        .and_then(|rest| rest.split("\n### ").next())
        .expect("the troubleshooting page has a Deleting objects in any order section");
    for needle in
        [capl::api::SKIP_HOST_CLEANUP_ANNOTATION, "HostCleanupSkipped", "ForeignObjectsLeft", "DeletionRetrying"]
    {
        assert!(section.contains(needle), "the deletion section does not mention {needle}");
    }
}

/// Every flag of the manager is in the book's Manager flags table, with the
/// default `--help` shows.
#[test]
fn manager_flags_table_matches_the_binary() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cluster-api-provider-libvirt"))
        .arg("--help")
        .output()
        .expect("run the manager with --help");
    let help = String::from_utf8(out.stdout).unwrap();
    let rows = table_rows(OPERATIONS, "| Flag | Default | Meaning |");
    let mut seen = 0;
    // clap prints each flag as "  --name <VALUE>" or "  --name", its help after
    // it, and the default as "[default: x]" at the end of that help.
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("--") {
            let name = rest.split([' ', '=']).next().unwrap().to_string();
            flags.push((format!("--{name}"), None));
        }
        if let Some((_, default)) = line.split_once("[default: ")
            && let Some(last) = flags.last_mut()
        {
            last.1 = default.split(']').next().map(str::to_string);
        }
    }
    for (flag, default) in &flags {
        if flag == "--help" || flag == "--version" {
            continue;
        }
        seen += 1;
        let row = rows
            .iter()
            .find(|r| r[0] == format!("`{flag}`"))
            .unwrap_or_else(|| panic!("{flag} is not in the Manager flags table of operations.md"));
        if let Some(default) = default {
            assert_eq!(row[1], format!("`{default}`"), "operations.md default of {flag}");
        }
    }
    assert!(seen >= 13, "parsed {seen} flags from --help:\n{help}");
}
