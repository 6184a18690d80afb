//! A TCP proxy that can cut a node off from etcd the way a dropping firewall does: connections
//! stay open, bytes are held back in both directions, nothing is refused or reset. No root needed.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

pub struct Proxy {
    port: u16,
    cut: Arc<(Mutex<bool>, Condvar)>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target` (host:port).
    pub fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        listener.set_nonblocking(true).expect("nonblocking listener");
        let cut = Arc::new((Mutex::new(false), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let target = target.to_string();
        let (cut_for_accept, stop_for_accept) = (cut.clone(), stop.clone());
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
                                let (cut, stop) = (cut_for_accept.clone(), stop_for_accept.clone());
                                thread::spawn(move || pump(from, to, cut, stop));
                            }
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Proxy { port, cut, stop }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
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

fn pump(mut from: TcpStream, mut to: TcpStream, cut: Arc<(Mutex<bool>, Condvar)>, stop: Arc<AtomicBool>) {
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
        if stop.load(Ordering::Relaxed) || to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
