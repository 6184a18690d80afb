//! Network namespaces for the packet-drop scenarios: a process (a node, or an etcd member) runs
//! in a namespace of its own, joined to the host's namespace by a veth pair on a /30 of
//! 198.18.0.0/15, and a drop is a one-instruction BPF filter on the root side of the pair that
//! discards every packet, both ways. The far end sees nothing: no RST, no ICMP, no ARP (the
//! neighbour entries are static), so its TCP connections hang as behind a dead link, the way
//! etcd's functional tester drops packets. Only the test's own namespace, veth pair and qdisc are
//! made, and [`Netns`]'s drop removes them, also when the test panics.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The classic BPF program of the drop, for `tc filter ... bpf bytecode`: one instruction,
/// `ret #2`, which in direct-action mode is `TC_ACT_SHOT` (drop). It needs no action module:
/// this kernel has no `act_gact`, so `bpf bytecode '1,6 0 0 0,' action drop` cannot load.
const DROP_ALL: &str = "1,6 0 0 2,";

/// One network namespace of a test and the veth pair that joins it to the host.
pub struct Netns {
    /// The namespace's name, for `ip netns exec`.
    pub name: String,
    /// The veth end in the host's namespace, where drops are made.
    pub root_veth: String,
    /// The address of the host's end: what a process in the namespace connects to.
    pub root_addr: Ipv4Addr,
    /// The address of the namespace's end: what the host connects to.
    pub ns_addr: Ipv4Addr,
    /// Whether the scenario that made this namespace may inject faults (`super::etcds`).
    faults_allowed: bool,
}

/// Asserts this process can make namespaces and filters: these scenarios need root and
/// iproute2's `ip` and `tc`, and fail, not skip, without them (CI runs them as root).
fn require_root_and_iproute2() {
    // SAFETY: geteuid only reads the process's credentials.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the packet-drop scenarios need root (they make network namespaces, veth pairs and tc filters); run the tests as root"
    );
    for tool in ["ip", "tc"] {
        let found = Command::new(tool)
            .arg("-V")
            .output()
            .is_ok_and(|out| out.status.success());
        assert!(
            found,
            "the packet-drop scenarios need `{tool}` from iproute2 (apt-get install iproute2)"
        );
    }
}

/// Runs `program args`, panicking with its output if it fails.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {program}: {err}"));
    assert!(
        out.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Runs `program args` for a clean-up, whatever its outcome.
fn run_quietly(program: &str, args: &[&str]) {
    let _ = Command::new(program).args(args).output();
}

impl Netns {
    /// Makes a namespace with loopback up and a veth pair to the host on a /30 of 198.18.0.0/15
    /// chosen from this process's id and a counter, with static neighbour entries on both ends.
    pub fn create() -> Netns {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        require_root_and_iproute2();
        let count = COUNT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        // 32,768 /30s in 198.18.0.0/15; 16 namespaces per process before two pids could meet.
        let subnet = (pid.wrapping_mul(16).wrapping_add(count)) % 32_768;
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + subnet * 4;
        let net = Netns {
            name: format!("shardcron-{pid}-{count}"),
            // At most 15 bytes: "sc" + 7 digits of pid + "r" + the counter.
            root_veth: format!("sc{pid}r{count}"),
            root_addr: Ipv4Addr::from(base + 1),
            ns_addr: Ipv4Addr::from(base + 2),
            faults_allowed: super::etcds::declared_on_both(),
        };
        let inner = "sc-inner";
        run("ip", &["netns", "add", &net.name]);
        // From here on the guard removes what was made, if a later step fails.
        let root_cidr = format!("{}/30", net.root_addr);
        let ns_cidr = format!("{}/30", net.ns_addr);
        run(
            "ip",
            &[
                "link",
                "add",
                &net.root_veth,
                "type",
                "veth",
                "peer",
                "name",
                inner,
                "netns",
                &net.name,
            ],
        );
        run("ip", &["addr", "add", &root_cidr, "dev", &net.root_veth]);
        run("ip", &["link", "set", &net.root_veth, "up"]);
        run("ip", &["-n", &net.name, "addr", "add", &ns_cidr, "dev", inner]);
        run("ip", &["-n", &net.name, "link", "set", inner, "up"]);
        run("ip", &["-n", &net.name, "link", "set", "lo", "up"]);
        // Static neighbours: a dropped link must not show up as failed ARP either.
        let root_mac = net.mac(None, &net.root_veth);
        let ns_mac = net.mac(Some(&net.name), inner);
        run(
            "ip",
            &[
                "neigh",
                "replace",
                &net.ns_addr.to_string(),
                "lladdr",
                &ns_mac,
                "dev",
                &net.root_veth,
                "nud",
                "permanent",
            ],
        );
        run(
            "ip",
            &[
                "-n",
                &net.name,
                "neigh",
                "replace",
                &net.root_addr.to_string(),
                "lladdr",
                &root_mac,
                "dev",
                inner,
                "nud",
                "permanent",
            ],
        );
        run("tc", &["qdisc", "add", "dev", &net.root_veth, "clsact"]);
        net
    }

    fn mac(&self, namespace: Option<&str>, device: &str) -> String {
        let mut args = Vec::new();
        if let Some(namespace) = namespace {
            args.extend(["-n", namespace]);
        }
        args.extend(["-brief", "link", "show", "dev", device]);
        let out = Command::new("ip").args(&args).output().expect("run ip");
        // "NAME@PEER  STATE  MAC  <FLAGS>"
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(2)
            .unwrap_or_else(|| panic!("no MAC address for {device}"))
            .to_string()
    }

    /// The wrapper that runs a program in this namespace, for `NodeBuilder::under`.
    pub fn exec(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.name]
    }

    /// Routes `host` (an address of the host's, such as another namespace's `root_addr`) through
    /// this namespace's veth pair, so a process in it reaches a listener the test put there:
    /// the host takes a packet to any of its addresses on any interface.
    pub fn route_to_host(&self, host: Ipv4Addr) {
        if host != self.root_addr {
            let to = format!("{host}/32");
            run(
                "ip",
                &[
                    "-n",
                    &self.name,
                    "route",
                    "add",
                    &to,
                    "via",
                    &self.root_addr.to_string(),
                ],
            );
        }
    }

    /// Drops every packet on the pair from now on, in both directions, silently.
    pub fn drop_packets(&self) {
        super::etcds::allow_fault(self.faults_allowed, "packets dropped");
        for direction in ["ingress", "egress"] {
            run(
                "tc",
                &[
                    "filter",
                    "add",
                    "dev",
                    &self.root_veth,
                    direction,
                    "bpf",
                    "bytecode",
                    DROP_ALL,
                    "da",
                ],
            );
        }
    }

    /// Removes the drop: packets flow again, and the connections that hung go on.
    pub fn heal(&self) {
        for direction in ["ingress", "egress"] {
            run("tc", &["filter", "del", "dev", &self.root_veth, direction]);
        }
    }

    /// Whether a TCP connection from inside the namespace to `host:port` hangs for `secs`
    /// seconds, neither made nor refused: what a silent drop does and a reset does not.
    pub fn connect_hangs(&self, host: Ipv4Addr, port: u16, secs: u32) -> bool {
        let status = Command::new("ip")
            .args(["netns", "exec", &self.name, "timeout", &secs.to_string(), "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{host}/{port}"))
            .status()
            .expect("run bash in the namespace");
        // timeout(1) exits 124 when the command was still running.
        status.code() == Some(124)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end deletes the pair and its qdisc; the namespace then goes with its name.
        run_quietly("ip", &["link", "del", &self.root_veth]);
        run_quietly("ip", &["netns", "del", &self.name]);
    }
}
