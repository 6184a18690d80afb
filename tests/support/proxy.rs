//! A TCP proxy that can cut a node off from etcd the way a dropping firewall does (connections
//! stay open, bytes are held back in both directions, nothing is refused or reset), slow it
//! down like a distant or overloaded etcd, or hold back the reply to one aimed request past
//! the caller's timeout (it reaches etcd and is carried out; the caller sees its call fail while
//! its connection lives on). No root needed.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub struct Proxy {
    host: std::net::Ipv4Addr,
    port: u16,
    cut: Arc<(Mutex<bool>, Condvar)>,
    /// Milliseconds each chunk is held before it is passed on, in each direction.
    delay_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    trap: Arc<Trap>,
    /// Whether the scenario that made this proxy may inject faults (`super::etcds`).
    faults_allowed: bool,
}

/// The request whose reply is to be held back: the first one, sent after the trap was armed,
/// whose bytes hold every pattern (gRPC sends keys and values as plain bytes); and how long.
#[derive(Default)]
struct Trap {
    armed: Mutex<Option<(Vec<Vec<u8>>, Duration)>>,
    sprung: AtomicU64,
}

/// One proxied connection: until when nothing goes back to its client.
#[derive(Default)]
struct Connection {
    held_until: Mutex<Option<Instant>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target` (host:port).
    pub fn start(target: &str) -> Proxy {
        Proxy::start_on(std::net::Ipv4Addr::LOCALHOST, target)
    }

    /// Listens on a free port of `host` (the host's end of a test's veth pair, say) and forwards
    /// every connection to `target` (host:port).
    pub fn start_on(host: std::net::Ipv4Addr, target: &str) -> Proxy {
        let listener = TcpListener::bind((host, 0)).expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        listener.set_nonblocking(true).expect("nonblocking listener");
        let cut = Arc::new((Mutex::new(false), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let trap = Arc::new(Trap::default());
        let target = target.to_string();
        let (cut_for_accept, stop_for_accept, delay_for_accept, trap_for_accept) =
            (cut.clone(), stop.clone(), delay_ms.clone(), trap.clone());
        thread::spawn(move || {
            while !stop_for_accept.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        let connection = Arc::new(Connection::default());
                        for (from, to, upstream) in [
                            (client.try_clone(), server.try_clone(), true),
                            (server.try_clone(), client.try_clone(), false),
                        ] {
                            if let (Ok(from), Ok(to)) = (from, to) {
                                let way = Way {
                                    cut: cut_for_accept.clone(),
                                    delay_ms: delay_for_accept.clone(),
                                    stop: stop_for_accept.clone(),
                                    trap: upstream.then(|| trap_for_accept.clone()),
                                    connection: connection.clone(),
                                };
                                thread::spawn(move || pump(from, to, way));
                            }
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Proxy {
            host,
            port,
            cut,
            delay_ms,
            stop,
            trap,
            faults_allowed: super::etcds::declared_on_both(),
        }
    }

    /// Holds back for `hold` everything etcd sends on the connection of the next request that
    /// holds every one of `patterns` (an etcd key, a value's bytes), from the moment it goes on
    /// to etcd: etcd carries it out, and with `hold` past the caller's timeout the caller sees
    /// its call fail; its later calls on that connection are answered once the hold ends. Once
    /// only: arm it again for another.
    pub fn hold_reply_to(&self, patterns: &[&[u8]], hold: Duration) {
        super::etcds::allow_fault(self.faults_allowed, "a proxy holding a reply");
        let patterns = patterns.iter().map(|pattern| pattern.to_vec()).collect();
        *self.trap.armed.lock().expect("trap lock") = Some((patterns, hold));
    }

    /// How many replies were held back by [`Proxy::hold_reply_to`].
    pub fn replies_held(&self) -> u64 {
        self.trap.sprung.load(Ordering::SeqCst)
    }

    /// Holds every chunk `delay` before passing it on, in each direction: a round trip to etcd
    /// takes at least twice that.
    pub fn slow(&self, delay: Duration) {
        super::etcds::allow_fault(self.faults_allowed, "a proxy slowing etcd");
        self.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn url(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// Holds back every byte in both directions until [`Proxy::heal`].
    pub fn cut(&self) {
        super::etcds::allow_fault(self.faults_allowed, "a proxy cutting a node off");
        *self.cut.0.lock().expect("cut lock") = true;
    }

    pub fn heal(&self) {
        *self.cut.0.lock().expect("cut lock") = false;
        self.cut.1.notify_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.heal();
    }
}

/// One direction of a proxied connection.
struct Way {
    cut: Arc<(Mutex<bool>, Condvar)>,
    delay_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// From the client to etcd: the trap that holds the connection's replies back.
    trap: Option<Arc<Trap>>,
    connection: Arc<Connection>,
}

impl Way {
    /// Holds back the connection's replies if `chunk` (after the end of the chunk before it,
    /// `tail`) is the aimed request.
    fn spring_on(&self, tail: &[u8], chunk: &[u8]) {
        let Some(trap) = &self.trap else { return };
        let mut armed = trap.armed.lock().expect("trap lock");
        let Some((patterns, hold)) = armed.as_ref() else { return };
        let seen = [tail, chunk].concat();
        if !patterns
            .iter()
            .all(|pattern| seen.windows(pattern.len()).any(|window| window == pattern.as_slice()))
        {
            return;
        }
        *self.connection.held_until.lock().expect("hold lock") = Some(Instant::now() + *hold);
        *armed = None;
        trap.sprung.fetch_add(1, Ordering::SeqCst);
    }
}

/// Passes bytes from `from` to `to`, holding them while the proxy is cut and delaying each chunk
/// by the proxy's delay from when it arrived: a delay line, so chunks in flight do not queue
/// behind each other's delays. Towards the client, nothing passes while the connection's replies
/// are held back.
fn pump(mut from: TcpStream, mut to: TcpStream, way: Way) {
    let (line, chunks) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let writer_stop = way.stop.clone();
    let writer = thread::spawn(move || {
        for (due, chunk) in chunks {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            if writer_stop.load(Ordering::Relaxed) || to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buffer = [0u8; 16 * 1024];
    // The end of the chunk before, so that a pattern split between two reads is still seen.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        {
            let (lock, healed) = &*way.cut;
            let mut is_cut = lock.lock().expect("cut lock");
            while *is_cut && !way.stop.load(Ordering::Relaxed) {
                is_cut = healed
                    .wait_timeout(is_cut, Duration::from_millis(200))
                    .expect("cut lock")
                    .0;
            }
        }
        let chunk = &buffer[..read];
        way.spring_on(&tail, chunk);
        tail = chunk[chunk.len().saturating_sub(1024)..].to_vec();
        let mut due = Instant::now() + Duration::from_millis(way.delay_ms.load(Ordering::Relaxed));
        if way.trap.is_none() {
            if let Some(until) = *way.connection.held_until.lock().expect("hold lock") {
                due = due.max(until);
            }
        }
        if way.stop.load(Ordering::Relaxed) || line.send((due, chunk.to_vec())).is_err() {
            break;
        }
    }
    drop(line);
    let _ = writer.join();
}
