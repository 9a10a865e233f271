//! The libvirt host as seen from outside the provider: `virsh -c <uri>`.
//!
//! Every check of the e2e scenarios about the host goes through here, so
//! what the tests assert is what an admin would see with virsh.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// One `<host>` entry of a network's DHCP configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpHost {
    pub mac: String,
    pub name: String,
    pub ip: String,
}

/// One line of `virsh net-dhcp-leases`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub mac: String,
    pub ip: String,
    pub hostname: String,
}

/// A libvirt host reached with virsh.
#[derive(Debug, Clone)]
pub struct HostView {
    pub uri: String,
}

impl HostView {
    pub fn new(uri: &str) -> Self {
        Self { uri: uri.to_string() }
    }

    /// Runs `virsh -q -c <uri> <args>` and returns stdout.
    pub fn virsh(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("virsh")
            .arg("-q")
            .arg("-c")
            .arg(&self.uri)
            .args(args)
            .output()
            .context("running virsh (install libvirt-clients: `cargo xtask host deps`)")?;
        if !out.status.success() {
            bail!("virsh -c {} {} failed: {}", self.uri, args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Whether `virsh <args>` succeeds (for existence checks).
    pub fn succeeds(&self, args: &[&str]) -> bool {
        self.virsh(args).is_ok()
    }

    /// Names of all domains, running or not.
    pub fn domains(&self) -> Result<Vec<String>> {
        Ok(lines(&self.virsh(&["list", "--all", "--name"])?))
    }

    /// Domains whose name starts with `prefix`.
    pub fn domains_with_prefix(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.domains()?.into_iter().filter(|d| d.starts_with(prefix)).collect())
    }

    /// `running`, `shut off`, ...
    pub fn domain_state(&self, domain: &str) -> Result<String> {
        Ok(self.virsh(&["domstate", domain])?.trim().to_string())
    }

    pub fn domain_uuid(&self, domain: &str) -> Result<String> {
        Ok(self.virsh(&["domuuid", domain])?.trim().to_ascii_lowercase())
    }

    /// The domain's id: a new one each time the domain starts (libvirt
    /// never reuses it while the daemon runs).
    pub fn domain_id(&self, domain: &str) -> Result<String> {
        Ok(self.virsh(&["domid", domain])?.trim().to_string())
    }

    /// The volume's key and path (`vol-key`, `vol-path`).
    pub fn volume_key_and_path(&self, pool: &str, volume: &str) -> Result<(String, String)> {
        let key = self.virsh(&["vol-key", "--pool", pool, volume])?.trim().to_string();
        let path = self.virsh(&["vol-path", "--pool", pool, volume])?.trim().to_string();
        Ok((key, path))
    }

    /// Stops a domain the hard way (as an admin's `virsh destroy`).
    pub fn destroy(&self, domain: &str) -> Result<()> {
        self.virsh(&["destroy", domain]).map(drop)
    }

    /// Volume names in `pool`, as libvirt lists them. No `pool-refresh`:
    /// libvirt refuses it while a volume upload runs ("asynchronous jobs
    /// running"), and volumes made through libvirt are listed without one.
    pub fn volumes(&self, pool: &str) -> Result<Vec<String>> {
        Ok(self
            .virsh(&["vol-list", pool])?
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect())
    }

    /// The `<host>` entries of `network`'s DHCP configuration (live XML).
    pub fn dhcp_hosts(&self, network: &str) -> Result<Vec<DhcpHost>> {
        let xml = self.virsh(&["net-dumpxml", network])?;
        Ok(xml
            .split("<host ")
            .skip(1)
            .map(|element| {
                let head = element.split('>').next().unwrap_or_default();
                DhcpHost {
                    mac: attribute(head, "mac").to_ascii_lowercase(),
                    name: attribute(head, "name"),
                    ip: attribute(head, "ip"),
                }
            })
            .collect())
    }

    /// The DNS host entries of `network` (live XML): each address with its host names.
    pub fn dns_hosts(&self, network: &str) -> Result<Vec<(String, Vec<String>)>> {
        Ok(dns_hosts_of(&self.virsh(&["net-dumpxml", network])?))
    }

    /// The current leases of `network`.
    pub fn leases(&self, network: &str) -> Result<Vec<Lease>> {
        // Expiry date, time, MAC, protocol, IP/prefix, hostname, client id.
        Ok(self
            .virsh(&["net-dhcp-leases", network])?
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                (f.len() >= 6 && f[3] == "ipv4").then(|| Lease {
                    mac: f[2].to_ascii_lowercase(),
                    ip: f[4].split('/').next().unwrap_or_default().to_string(),
                    hostname: f[5].to_string(),
                })
            })
            .collect())
    }

    /// Whether the network exists and is active.
    pub fn network_active(&self, network: &str) -> bool {
        info_active(self.virsh(&["net-info", network]).ok())
    }

    /// Whether the pool exists and is running.
    pub fn pool_active(&self, pool: &str) -> bool {
        self.virsh(&["pool-info", pool])
            .map(|text| text.lines().any(|l| l.starts_with("State:") && l.contains("running")))
            .unwrap_or(false)
    }

    /// Whether the volume exists in the pool.
    pub fn volume_exists(&self, pool: &str, volume: &str) -> bool {
        self.succeeds(&["vol-info", "--pool", pool, volume])
    }
}

/// The `<dns><host ip=...><hostname>...` entries of a network's XML.
fn dns_hosts_of(xml: &str) -> Vec<(String, Vec<String>)> {
    let Some(dns) = xml.split("<dns").nth(1).and_then(|rest| rest.split("</dns>").next()) else {
        return Vec::new();
    };
    dns.split("<host ")
        .skip(1)
        .map(|element| {
            let head = element.split('>').next().unwrap_or_default();
            let body = element.split("</host>").next().unwrap_or_default();
            let names = body
                .split("<hostname>")
                .skip(1)
                .filter_map(|n| n.split("</hostname>").next())
                .map(|n| n.trim().to_string())
                .collect();
            (attribute(head, "ip"), names)
        })
        .collect()
}

fn info_active(text: Option<String>) -> bool {
    text.is_some_and(|t| t.lines().any(|l| l.starts_with("Active:") && l.contains("yes")))
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// The value of `name='...'` or `name="..."` in an XML start tag.
fn attribute(tag: &str, name: &str) -> String {
    for quote in ['\'', '"'] {
        let key = format!("{name}={quote}");
        if let Some(start) = tag.find(&key) {
            let rest = &tag[start + key.len()..];
            return rest.split(quote).next().unwrap_or_default().to_string();
        }
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_with_either_quote() {
        let tag = "mac='52:54:00:AA:bb:cc' name=\"dom-1\" ip='10.251.0.5'/";
        assert_eq!(attribute(tag, "mac"), "52:54:00:AA:bb:cc");
        assert_eq!(attribute(tag, "name"), "dom-1");
        assert_eq!(attribute(tag, "ip"), "10.251.0.5");
        assert_eq!(attribute(tag, "missing"), "");
    }

    #[test]
    fn dns_hosts_are_read_from_the_dns_element_only() {
        let xml = "<network><name>n</name><dns><host ip='10.251.0.254'>\n<hostname>capl-endpoint-u1</hostname>\n\
                   </host><host ip='10.251.0.253'><hostname>a</hostname><hostname>b</hostname></host></dns>\n\
                   <ip address='10.251.0.1'><dhcp><host mac='52:54:00:00:00:01' ip='10.251.0.5'/></dhcp></ip></network>";
        assert_eq!(
            dns_hosts_of(xml),
            vec![
                ("10.251.0.254".to_string(), vec!["capl-endpoint-u1".to_string()]),
                ("10.251.0.253".to_string(), vec!["a".to_string(), "b".to_string()]),
            ]
        );
        assert!(dns_hosts_of("<network><ip><dhcp><host mac='m' ip='i'/></dhcp></ip></network>").is_empty());
    }
}
