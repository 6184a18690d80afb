//! A webhook receiver on loopback for notification tests: it keeps every request it takes, and
//! can be taken down (its port closed: connections are refused) and brought back on the same
//! port.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the receiver took.
#[derive(Debug, Clone)]
pub struct Hit {
    pub method: String,
    pub path: String,
    /// Names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Hit {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|err| panic!("not JSON ({err}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

pub struct Receiver {
    pub port: u16,
    /// The address it listens on: loopback, unless started with [`Receiver::start_on`].
    host: Ipv4Addr,
    hits: Arc<Mutex<Vec<Hit>>>,
    up: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        Receiver::start_on(Ipv4Addr::LOCALHOST)
    }

    /// A receiver on a free port of `host`: the host's end of a test's veth pair, say, for nodes
    /// in network namespaces, which cannot reach the host's loopback.
    pub fn start_on(host: Ipv4Addr) -> Receiver {
        let listener = TcpListener::bind((host, 0)).expect("bind the receiver");
        let port = listener.local_addr().expect("its address").port();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let up = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (hits, up, stop) = (Arc::clone(&hits), Arc::clone(&up), Arc::clone(&stop));
            std::thread::spawn(move || serve(listener, host, port, &hits, &up, &stop))
        };
        Receiver {
            port,
            host,
            hits,
            up,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.host, self.port)
    }

    /// Closes the port: connections are refused until [`Receiver::up`].
    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        // The serving thread drops the listener within its poll.
        std::thread::sleep(Duration::from_millis(100));
    }

    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().expect("hits").clone()
    }

    /// The requests to paths starting with `prefix`.
    pub fn hits_on(&self, prefix: &str) -> Vec<Hit> {
        self.hits()
            .into_iter()
            .filter(|hit| hit.path.starts_with(prefix))
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(listener: TcpListener, host: Ipv4Addr, port: u16, hits: &Mutex<Vec<Hit>>, up: &AtomicBool, stop: &AtomicBool) {
    let mut listener = Some(listener);
    while !stop.load(Ordering::SeqCst) {
        match (up.load(Ordering::SeqCst), listener.is_some()) {
            (false, true) => listener = None,
            // std sets SO_REUSEADDR: the same port binds again at once.
            (true, false) => listener = TcpListener::bind((host, port)).ok(),
            _ => {}
        }
        let Some(open) = &listener else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        open.set_nonblocking(true).expect("nonblocking");
        match open.accept() {
            Ok((stream, _)) => {
                if let Some(hit) = take(stream) {
                    hits.lock().expect("hits").push(hit);
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Reads one request and answers 200.
fn take(stream: TcpStream) -> Option<Hit> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let mut stream = stream;
    stream
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .ok()?;
    Some(Hit {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
