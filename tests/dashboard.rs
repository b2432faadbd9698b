//! The web dashboard in headless Chromium, driven through chromedriver
//! (WebDriver): `ethersan serve --api` with a RAM LUN; the page opened
//! with `#token=…` shows the tree and live charts without a console
//! error; `ethersan bench` makes its IOPS figure move; a LUN added with
//! its form is seen by libiscsi's `iscsi-ls` and in the tree; a grant made
//! with its form shows in the target's access list; an API error shows on
//! the page. Screenshots go to the temporary directory, or to
//! docs/dashboard.png and docs/dashboard-lun.png with
//! ETHERSAN_UPDATE_SCREENSHOTS=1. Loopback only, bounded at 90 s.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, require_tool, Server, IQN};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

const TOKEN: &str = "dashboard-test-token-0123456789";
const GRANTED: &str = "iqn.2026-11.org.example:dashboard-host";

/// chromedriver on a free loopback port, killed on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start() -> Driver {
        require_tool("chromedriver");
        require_tool("chromium");
        let port = free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let d = Driver { child, port };
        let until = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The browser's console since the last call (chromedriver's legacy log
/// endpoint; `goog:loggingPrefs` asks it to keep everything).
fn browser_log(port: u16, session: &str) -> Vec<Value> {
    let body = r#"{"type":"browser"}"#;
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /session/{session}/se/log HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read the headers, then Content-Length bytes (chromedriver may keep
    // the connection open).
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let body_len = loop {
        let n = s.read(&mut chunk).expect("chromedriver's log answer");
        assert!(
            n > 0,
            "chromedriver closed: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(h) = text.find("\r\n\r\n") {
            let len = text[..h]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .expect("a Content-Length");
            if buf.len() >= h + 4 + len {
                break buf[h + 4..h + 4 + len].to_vec();
            }
        }
    };
    let v: Value = serde_json::from_slice(&body_len).unwrap_or_else(|e| {
        panic!(
            "chromedriver's log answer is not JSON ({e}): {}",
            String::from_utf8_lossy(&body_len)
        );
    });
    v["value"].as_array().cloned().unwrap_or_default()
}

fn severe(log: &[Value]) -> Vec<String> {
    log.iter()
        .filter(|e| e["level"] == "SEVERE")
        .map(|e| e["message"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The visible text of the first element matching `css`, read in one
/// script (the page re-renders its tree: a found element may go stale
/// before its text is asked for).
async fn text(c: &Client, css: &str) -> String {
    let v = c
        .execute(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
            vec![json!(css)],
        )
        .await
        .unwrap();
    match v {
        Value::String(s) => s.trim().to_string(),
        _ => panic!("no {css} on the page"),
    }
}

/// Poll `f` every 200 ms until it gives `Some`, for at most `limit`.
async fn until<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    assert!(png.len() > 10_000, "{name}: a blank screenshot?");
    // The committed pictures in docs/ are renewed only when asked
    // (ETHERSAN_UPDATE_SCREENSHOTS=1); otherwise a test run leaves the
    // tree as it was and writes beside its build.
    let dir = if std::env::var_os("ETHERSAN_UPDATE_SCREENSHOTS").is_some() {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs")
    } else {
        std::env::temp_dir()
    };
    std::fs::write(dir.join(name), png).unwrap();
}

/// Pixels drawn on the first chart canvas of a LUN's card.
async fn inked_pixels(c: &Client, key: &str) -> u64 {
    let v = c
        .execute(
            "const cv = document.querySelector(`.lun-card[data-key=\"${arguments[0]}\"] canvas`);
             if (!cv || cv.width === 0) return 0;
             const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
             let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
             return n;",
            vec![json!(key)],
        )
        .await
        .unwrap();
    v.as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_live_luns_and_its_forms_work() {
    require_tool("iscsi-ls");
    tokio::time::timeout(Duration::from_secs(90), run())
        .await
        .expect("the dashboard test took over 90 s");
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let srv = Server::start_args_in(
        &[
            "serve".into(),
            "--target".into(),
            IQN.into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--lun".into(),
            "ram:64M".into(),
            "--api".into(),
            "127.0.0.1:0".into(),
            "--api-token-file".into(),
            token_file.to_str().unwrap().into(),
        ],
        Some(dir.path()),
    );
    let api = srv
        .log
        .lock()
        .unwrap()
        .iter()
        .find_map(|l| {
            l.split("dashboard on ")
                .nth(1)
                .map(|u| u.trim().to_string())
        })
        .expect("serve did not say where the dashboard is");

    let driver = Driver::start();
    let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1000",
                     "--no-first-run", "--no-default-browser-check"]
        },
        "goog:loggingPrefs": { "browser": "ALL" }
    }))
    .unwrap();
    let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("chromedriver session");
    let session = c.session_id().await.unwrap().expect("a session id");

    // The page takes the token from the fragment, keeps it in this tab and
    // takes it out of the address bar.
    c.goto(&format!("{api}#token={TOKEN}")).await.unwrap();
    let key = format!("{IQN}/0");
    c.wait()
        .at_most(Duration::from_secs(15))
        .for_element(Locator::Css(&format!(".lun-card[data-key=\"{key}\"]")))
        .await
        .expect("no chart card for LUN 0: the page shows nothing");
    let url = c.current_url().await.unwrap();
    assert!(
        !url.as_str().contains("token"),
        "the token stays in the URL: {url}"
    );
    let kept = c
        .execute(
            "return sessionStorage.getItem('ethersan-api-token')",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(kept, json!(TOKEN));
    until(
        Duration::from_secs(10),
        "the target in the tree",
        || async {
            let t = text(&c, "#tree").await;
            (t.contains(IQN) && t.contains("LUN 0") && t.contains("64.0 MiB")).then_some(())
        },
    )
    .await;
    assert_eq!(text(&c, "#status").await, "live");
    assert!(
        !c.find(Locator::Css("#error"))
            .await
            .unwrap()
            .is_displayed()
            .await
            .unwrap(),
        "the page shows an error: {}",
        text(&c, "#error").await
    );

    // Load: the IOPS figure moves above zero, a session shows.
    let bench_url = format!("iscsi://{}/{IQN}/0", srv.addr);
    let bench = Command::new(env!("CARGO_BIN_EXE_ethersan"))
        .args([
            "bench", &bench_url, "--time", "8s", "--rw", "mixed", "--qd", "4",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ethersan bench");
    let iops: u64 = until(Duration::from_secs(15), "IOPS above zero", || async {
        let n: u64 = text(&c, "#total-iops").await.parse().unwrap_or(0);
        (n > 0).then_some(n)
    })
    .await;
    let card = format!(".lun-card[data-key=\"{key}\"]");
    until(
        Duration::from_secs(10),
        "a session in the table",
        || async {
            let t = text(&c, "#sessions-table").await;
            t.contains("iscsi").then_some(())
        },
    )
    .await;
    // A few seconds of history for the picture.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let card_iops = text(&c, &format!("{card} .iops")).await;
    let p50 = text(&c, &format!("{card} .p50")).await;
    let p99 = text(&c, &format!("{card} .p99")).await;
    let mbps = text(&c, "#total-mbps").await;
    let ink = inked_pixels(&c, &key).await;
    assert!(ink > 200, "the IOPS chart is blank ({ink} pixels drawn)");
    screenshot(&c, "dashboard.png").await;
    let bench_out = tokio::task::spawn_blocking(move || bench.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(bench_out.status.success(), "bench failed: {bench_out:?}");
    eprintln!(
        "dashboard: total IOPS {iops} first seen, LUN 0 {card_iops} IOPS, {mbps} MB/s, p50 {p50} µs, p99 {p99} µs, {ink} pixels on the IOPS chart"
    );

    // The add-LUN form: the new LUN answers iscsi-ls and shows in the tree.
    c.find(Locator::Css("#lun-spec"))
        .await
        .unwrap()
        .send_keys("ram:32M")
        .await
        .unwrap();
    c.find(Locator::Css("#lun-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(Duration::from_secs(10), "LUN 1 in the tree", || async {
        let found = c
            .find_all(Locator::Css(&format!(
                "#tree li[data-target=\"{IQN}\"] li[data-lun=\"1\"]"
            )))
            .await
            .unwrap();
        (!found.is_empty()).then_some(())
    })
    .await;
    let notice = text(&c, "#notice").await;
    assert!(notice.contains("LUN 1"), "notice: {notice}");
    let addr = srv.addr.clone();
    let ls = tokio::task::spawn_blocking(move || {
        let out = Command::new("iscsi-ls")
            .args(["-s", &format!("iscsi://{addr}/")])
            .output()
            .expect("run iscsi-ls");
        assert!(out.status.success(), "iscsi-ls failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap();
    assert!(ls.contains("Lun:1"), "iscsi-ls does not list LUN 1:\n{ls}");
    until(
        Duration::from_secs(10),
        "a chart card for LUN 1",
        || async {
            let found = c
                .find_all(Locator::Css(&format!(".lun-card[data-key=\"{IQN}/1\"]")))
                .await
                .unwrap();
            (!found.is_empty()).then_some(())
        },
    )
    .await;

    // The grant form: the target's access list names the initiator.
    c.find(Locator::Css("#grant-entry"))
        .await
        .unwrap()
        .send_keys(GRANTED)
        .await
        .unwrap();
    c.find(Locator::Css("#grant-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(Duration::from_secs(10), "the grant in the tree", || async {
        text(&c, &format!("#tree li[data-target=\"{IQN}\"] .acl"))
            .await
            .contains(GRANTED)
            .then_some(())
    })
    .await;
    screenshot(&c, "dashboard-lun.png").await;

    // Nothing went wrong in the browser so far.
    let log = browser_log(driver.port, &session);
    let errors = severe(&log);
    assert!(errors.is_empty(), "console errors: {errors:#?}");

    // An API error shows on the page.
    c.find(Locator::Css("#lun-spec"))
        .await
        .unwrap()
        .send_keys("nonsense:spec")
        .await
        .unwrap();
    c.find(Locator::Css("#lun-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let shown = until(
        Duration::from_secs(10),
        "the API error on the page",
        || async {
            let e = c.find(Locator::Css("#error")).await.unwrap();
            if !e.is_displayed().await.unwrap() {
                return None;
            }
            Some(e.text().await.unwrap())
        },
    )
    .await;
    assert!(
        shown.contains("POST /api/v1/targets/") && shown.contains(" 422 "),
        "error shown: {shown}"
    );
    c.close().await.unwrap();
}
