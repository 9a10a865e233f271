//! What every scenario needs: the backend's connection, unique names, XML builders,
//! and cleanup that runs even when a scenario fails.

use std::cell::RefCell;
use std::convert::Infallible;
use std::path::PathBuf;
use std::time::Duration;

use capl_host::hypervisor::{ErrorKind, HostAdmin, HypervisorError, UndefineFlags};
use capl_testbed::wait::{self, Bound};

// Where the tiny test guest image is (`cargo xtask guest-image` prints it).
use capl_testbed::env::GUEST_IMAGE;

/// The four backends the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `libvirt-sim` through `SimHypervisor`.
    Sim,
    /// libvirt's in-process `test:///default` driver through `LibvirtHypervisor`.
    TestDriver,
    /// A real libvirtd (URI in `CAPL_TEST_LIBVIRT_URI`) through `LibvirtHypervisor`.
    RealLibvirtd,
    /// A real libvirtd in a container the test starts with testcontainers
    /// (`testenv::container_libvirtd`), through `LibvirtHypervisor`.
    ContainerLibvirtd,
}

impl Backend {
    pub fn label(self) -> &'static str {
        match self {
            Backend::Sim => "libvirt-sim",
            Backend::TestDriver => "test:///default",
            Backend::RealLibvirtd => "real libvirtd",
            Backend::ContainerLibvirtd => "containerized libvirtd",
        }
    }

    /// A libvirtd with QEMU behind it (guests boot, dnsmasq hands out leases).
    pub fn is_daemon(self) -> bool {
        matches!(self, Backend::RealLibvirtd | Backend::ContainerLibvirtd)
    }
}

enum Cleanup {
    Domain(String),
    Network(String),
    Pool(String),
    Volume(String, String),
    Dir(PathBuf),
}

/// One scenario's world: the connection, a unique name prefix, cleanup on drop.
pub struct Ctx<'a> {
    pub hv: &'a dyn HostAdmin,
    pub backend: Backend,
    /// Unique per run and scenario; every object name starts with it.
    pub prefix: String,
    /// A small number unique per scenario in this run (subnets, bridge names).
    pub index: u32,
    cleanup: RefCell<Vec<Cleanup>>,
}

impl<'a> Ctx<'a> {
    pub fn new(hv: &'a dyn HostAdmin, backend: Backend, run: u32, index: u32) -> Self {
        Ctx { hv, backend, prefix: format!("capl-conf-{run}-{index}"), index, cleanup: RefCell::new(Vec::new()) }
    }

    /// Whether "not found" messages name the object. The test driver says only
    /// "Domain not found" (listed in libvirt-sim/README.md).
    pub fn messages_name_objects(&self) -> bool {
        self.backend != Backend::TestDriver
    }

    /// Bytes for a bootable disk. On a real libvirtd (on the host or in a container): the tiny test guest (boots under
    /// TCG and asks for DHCP), from `CAPL_GUEST_IMAGE` or `cargo xtask guest-image`.
    /// Simulated guests need no image: a few stand-in bytes.
    pub fn guest_image(&self) -> Vec<u8> {
        if !self.backend.is_daemon() {
            return b"stand-in disk: simulated guests boot without an image".to_vec();
        }
        let path = match std::env::var_os(GUEST_IMAGE) {
            Some(path) => PathBuf::from(path),
            None => {
                let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .parent()
                    .expect("capl-host lives in the repository");
                let out = std::process::Command::new("cargo")
                    .args(["xtask", "guest-image"])
                    .current_dir(root)
                    .stderr(std::process::Stdio::inherit())
                    .output()
                    .unwrap_or_else(|e| panic!("running `cargo xtask guest-image` (or set {GUEST_IMAGE}): {e}"));
                assert!(
                    out.status.success(),
                    "`cargo xtask guest-image` failed ({}): the real-libvirtd lease scenario needs the tiny test guest; \
                     build it with `cargo xtask guest-image` or point {GUEST_IMAGE} at a base.qcow2",
                    out.status
                );
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        std::fs::read(&path).unwrap_or_else(|e| panic!("read the guest image {} ({GUEST_IMAGE}): {e}", path.display()))
    }

    pub fn name(&self, what: &str) -> String {
        format!("{}-{what}", self.prefix)
    }

    /// A /24 for this scenario's network: 10.231.<index>.0/24 (nothing else on these hosts uses 10.231/16).
    pub fn subnet(&self) -> u32 {
        self.index % 250
    }

    /// Defines (and starts when `active`) an isolated network with a DHCP range .100-.200.
    pub fn network(&self, what: &str, active: bool) -> String {
        let name = self.name(what);
        let xml = network_xml(&name, &self.bridge(what), self.subnet(), None);
        let defined = self.hv.network_define(&xml).unwrap_or_else(|e| panic!("define network {name}: {e}"));
        assert_eq!(defined, name);
        self.cleanup.borrow_mut().push(Cleanup::Network(name.clone()));
        if active {
            self.hv.network_start(&name).unwrap_or_else(|e| panic!("start network {name}: {e}"));
        }
        name
    }

    /// A bridge name unique to this scenario (at most 15 characters).
    pub fn bridge(&self, what: &str) -> String {
        let tag: u32 = what.bytes().map(u32::from).sum::<u32>() % 100;
        format!("cc{}x{}x{tag}", std::process::id() % 10000, self.index)
    }

    /// Defines, builds and starts a dir pool in a fresh directory under the temp dir.
    pub fn pool(&self, what: &str) -> String {
        let name = self.name(what);
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create pool directory {}: {e}", dir.display()));
        self.cleanup.borrow_mut().push(Cleanup::Dir(dir.clone()));
        let xml = format!("<pool type='dir'><name>{name}</name><target><path>{}</path></target></pool>", dir.display());
        assert_eq!(self.hv.pool_define(&xml).unwrap_or_else(|e| panic!("define pool {name}: {e}")), name);
        self.cleanup.borrow_mut().push(Cleanup::Pool(name.clone()));
        self.hv.pool_build(&name).unwrap_or_else(|e| panic!("build pool {name}: {e}"));
        self.hv.pool_start(&name).unwrap_or_else(|e| panic!("start pool {name}: {e}"));
        name
    }

    /// The target directory of a pool made by [`Ctx::pool`].
    pub fn pool_dir(&self, pool: &str) -> String {
        std::env::temp_dir().join(pool).display().to_string()
    }

    /// Creates a volume from XML in `pool`, cleaned up afterwards.
    pub fn volume(&self, pool: &str, xml: &str) -> String {
        let name = self.hv.volume_create(pool, xml).unwrap_or_else(|e| panic!("create volume in {pool}: {e}\n{xml}"));
        self.cleanup.borrow_mut().push(Cleanup::Volume(pool.to_string(), name.clone()));
        name
    }

    /// Defines a domain from XML, cleaned up afterwards (destroyed if running, undefined).
    pub fn define(&self, xml: &str) -> String {
        let name = self.hv.domain_define(xml).unwrap_or_else(|e| panic!("define domain: {e}\n{xml}"));
        self.forget_domain_later(&name);
        name
    }

    pub fn forget_domain_later(&self, name: &str) {
        self.cleanup.borrow_mut().push(Cleanup::Domain(name.to_string()));
    }
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        // Reverse order: domains before the networks and volumes they use.
        for item in self.cleanup.borrow_mut().drain(..).rev() {
            match item {
                Cleanup::Domain(d) => {
                    let _ = self.hv.domain_destroy(&d);
                    if self.hv.domain_undefine(&d, UndefineFlags::all()).is_err() {
                        // The test driver refuses the NVRAM flag.
                        let _ = self.hv.domain_undefine(&d, UndefineFlags::default());
                    }
                }
                Cleanup::Network(n) => {
                    let _ = self.hv.network_stop(&n);
                    let _ = self.hv.network_undefine(&n);
                }
                Cleanup::Volume(p, v) => {
                    let _ = self.hv.volume_delete(&p, &v);
                }
                Cleanup::Pool(p) => {
                    let _ = self.hv.pool_stop(&p);
                    let _ = self.hv.pool_undefine(&p);
                }
                Cleanup::Dir(d) => {
                    let _ = std::fs::remove_dir_all(d);
                }
            }
        }
    }
}

/// Network XML: isolated (no forward), 10.231.<subnet>.1/24, DHCP .100-.200, optional reservation.
pub fn network_xml(name: &str, bridge: &str, subnet: u32, host: Option<&str>) -> String {
    format!(
        "<network><name>{name}</name><bridge name='{bridge}'/>\
         <ip address='10.231.{subnet}.1' netmask='255.255.255.0'><dhcp>\
         <range start='10.231.{subnet}.100' end='10.231.{subnet}.200'/>{}</dhcp></ip></network>",
        host.unwrap_or("")
    )
}

/// Domain XML for a `type='qemu'` guest with no disk; `extra` goes into `<devices>`.
pub fn domain_xml(name: &str, uuid: Option<&str>, metadata: Option<&str>, devices: &str) -> String {
    let uuid = uuid.map(|u| format!("<uuid>{u}</uuid>")).unwrap_or_default();
    let metadata = metadata.map(|m| format!("<metadata>{m}</metadata>")).unwrap_or_default();
    format!(
        "<domain type='qemu'><name>{name}</name>{uuid}{metadata}<memory unit='MiB'>32</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>{devices}</devices></domain>"
    )
}

/// An interface on `network` with `mac`.
pub fn interface_xml(network: &str, mac: &str) -> String {
    format!(
        "<interface type='network'><mac address='{mac}'/><source network='{network}'/><model type='virtio'/></interface>"
    )
}

/// One expected error a scenario saw: what was tried, libvirt's code, the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenError {
    pub what: String,
    pub code: i32,
    pub message: String,
}

thread_local! {
    static SEEN: RefCell<Vec<SeenError>> = const { RefCell::new(Vec::new()) };
}

/// The expected errors seen on this thread since the last call.
pub fn take_seen_errors() -> Vec<SeenError> {
    SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

/// Asserts that `result` failed with `kind` (and, when given, libvirt's numeric `code`).
#[track_caller]
pub fn expect_err<T: std::fmt::Debug>(
    result: Result<T, HypervisorError>,
    kind: ErrorKind,
    code: Option<i32>,
    what: &str,
) -> HypervisorError {
    match result {
        Ok(v) => panic!("{what}: expected {kind:?} error, got Ok({v:?})"),
        Err(e) => {
            SEEN.with(|s| {
                s.borrow_mut().push(SeenError { what: what.to_string(), code: e.code, message: e.message.clone() })
            });
            assert_eq!(e.kind, kind, "{what}: wrong error class: {e}");
            if let Some(code) = code {
                assert_eq!(e.code, code, "{what}: wrong libvirt error code: {e}");
            }
            e
        }
    }
}

/// Polls `f` until it returns `Some`, at most `timeout`.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let bound = Bound::new(timeout, Duration::from_millis(200));
    wait::blocking(bound, || Ok::<_, Infallible>(f().into())).ok()
}

/// The text of the first `<tag ...>` element's attribute `attr` in `xml` (for read-back checks).
pub fn attr_of(xml: &str, tag: &str, attr: &str) -> Option<String> {
    let start = xml.find(&format!("<{tag} "))?;
    let rest = &xml[start..];
    let end = rest.find('>')?;
    let element = &rest[..end];
    let key = format!("{attr}=");
    let at = element.find(&key)? + key.len();
    let quote = element[at..].chars().next()?;
    let value = &element[at + 1..];
    Some(value[..value.find(quote)?].to_string())
}

/// The text content of the first `<tag>` element in `xml`.
pub fn text_of(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}");
    let start = xml.find(&open)?;
    let after = start + xml[start..].find('>')? + 1;
    let close = xml[after..].find(&format!("</{tag}>"))?;
    Some(xml[after..after + close].trim().to_string())
}
