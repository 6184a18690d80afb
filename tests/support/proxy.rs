//! A TCP proxy that can cut a node off from etcd the way a dropping firewall does (connections
//! stay open, bytes are held back in both directions, nothing is refused or reset), or slow it
//! down like a distant or overloaded etcd. No root needed.

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
        let target = target.to_string();
        let (cut_for_accept, stop_for_accept, delay_for_accept) = (cut.clone(), stop.clone(), delay_ms.clone());
        thread::spawn(move || {
            while !stop_for_accept.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        for (from, to) in [
                            (client.try_clone(), server.try_clone()),
                            (server.try_clone(), client.try_clone()),
                        ] {
                            if let (Ok(from), Ok(to)) = (from, to) {
                                let (cut, stop, delay) = (
                                    cut_for_accept.clone(),
                                    stop_for_accept.clone(),
                                    delay_for_accept.clone(),
                                );
                                thread::spawn(move || pump(from, to, cut, delay, stop));
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
        }
    }

    /// Holds every chunk `delay` before passing it on, in each direction: a round trip to etcd
    /// takes at least twice that.
    pub fn slow(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn url(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// Holds back every byte in both directions until [`Proxy::heal`].
    pub fn cut(&self) {
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

/// Passes bytes from `from` to `to`, holding them while the proxy is cut and delaying each chunk
/// by the proxy's delay from when it arrived: a delay line, so chunks in flight do not queue
/// behind each other's delays.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    cut: Arc<(Mutex<bool>, Condvar)>,
    delay_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    let (line, chunks) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let writer_stop = stop.clone();
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
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        {
            let (lock, healed) = &*cut;
            let mut is_cut = lock.lock().expect("cut lock");
            while *is_cut && !stop.load(Ordering::Relaxed) {
                is_cut = healed
                    .wait_timeout(is_cut, Duration::from_millis(200))
                    .expect("cut lock")
                    .0;
            }
        }
        let due = Instant::now() + Duration::from_millis(delay_ms.load(Ordering::Relaxed));
        if stop.load(Ordering::Relaxed) || line.send((due, buffer[..read].to_vec())).is_err() {
            break;
        }
    }
    drop(line);
    let _ = writer.join();
}
