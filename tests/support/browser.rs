//! A real headless browser for page tests: Debian's `chromium`, driven over WebDriver through
//! `chromedriver` (package `chromium-driver`), both installed by `scripts/setup`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use super::{http_request, wait_for};

/// One chromedriver process and one browser session on it; both end when this is dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn find_program(names: &[&str]) -> String {
    for name in names {
        for dir in ["/usr/bin", "/usr/lib/chromium", "/usr/local/bin"] {
            let path = Path::new(dir).join(name);
            if path.exists() {
                return path.display().to_string();
            }
        }
    }
    panic!("none of {names:?} is installed: scripts/setup installs Debian's chromium and chromium-driver");
}

impl Browser {
    /// Starts chromedriver and a headless chromium with a window of `width` × `height`.
    pub fn start(width: u32, height: u32) -> Browser {
        let driver_path = find_program(&["chromedriver"]);
        let chromium = find_program(&["chromium", "chromium-browser"]);
        let port = shardcron::etcd_server::free_port().expect("free port");
        let driver = Command::new(driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        wait_for(Duration::from_secs(20), "chromedriver listens", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
        };
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                // --no-sandbox: tests may run as root, where chromium's sandbox refuses to start.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--hide-scrollbars", format!("--window-size={width},{height}")]
            }
        }}});
        let created = browser.call("POST", "/session", Some(capabilities));
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session from chromedriver: {created}"))
            .to_string();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|body| body.to_string()).unwrap_or_default();
        let headers: &[(&str, &str)] = if body.is_empty() {
            &[]
        } else {
            &[("Content-Type", "application/json")]
        };
        let response = http_request(self.port, method, path, headers, &body);
        let value = response.json();
        let value = value.get("value").cloned().unwrap_or(Value::Null);
        if response.status != 200 {
            panic!("WebDriver {method} {path} answered {}: {value}", response.status);
        }
        value
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn open(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })));
    }

    pub fn resize(&self, width: u32, height: u32) {
        self.session_call(
            "POST",
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        );
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    pub fn script(&self, script: &str) -> Value {
        self.session_call("POST", "/execute/sync", Some(json!({ "script": script, "args": [] })))
    }

    /// The id of the first element matching `css` that is displayed, waiting up to `limit`.
    pub fn wait_for_element(&self, css: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let found = self.script(&format!(
                "const e = document.querySelector({}); return !!e && e.getClientRects().length > 0;",
                json!(css)
            ));
            if found == Value::Bool(true) {
                let element =
                    self.session_call("POST", "/element", Some(json!({"using": "css selector", "value": css})));
                return element[ELEMENT].as_str().expect("element id").to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no visible {css} within {limit:?}; page text:\n{}",
                self.text("body")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn click(&self, css: &str) {
        let element = self.wait_for_element(css, Duration::from_secs(10));
        self.session_call("POST", &format!("/element/{element}/click"), Some(json!({})));
    }

    pub fn type_into(&self, css: &str, text: &str) {
        let element = self.wait_for_element(css, Duration::from_secs(10));
        self.session_call(
            "POST",
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// The rendered text of the first element matching `css`, or "" if there is none.
    pub fn text(&self, css: &str) -> String {
        self.script(&format!(
            "const e = document.querySelector({}); return e ? e.innerText : '';",
            json!(css)
        ))
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// Waits until the text of `css` satisfies `wanted`.
    pub fn wait_for_text(&self, css: &str, what: &str, limit: Duration, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.text(css);
            if wanted(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}; {css} reads {text:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Saves a PNG of the window to `path`.
    pub fn screenshot(&self, path: &Path) {
        let encoded = self.session_call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("base64 PNG"))
            .expect("decode the screenshot");
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                http_request(self.port, "DELETE", &format!("/session/{}", self.session), &[], "")
            }));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
