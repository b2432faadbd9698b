//! Faults at the server: a full filesystem and a `kill -9` with writes in
//! flight. Nothing acknowledged is lost; errors become the right sense data
//! and other LUNs keep serving.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{Server, IQN};
use ethersan_initiator::{connect, LoginOptions, Session};

async fn session(server: &Server) -> Session {
    let opts = LoginOptions {
        target_name: Some(IQN.into()),
        ..Default::default()
    };
    let s = connect(&server.addr, &opts).await.expect("login");
    for lun in 0..2 {
        s.clear_unit_attention(lun).await.unwrap();
    }
    s
}

/// A tmpfs of `size` mounted at `dir` for the life of the guard.
struct Mount(std::path::PathBuf);

impl Mount {
    fn tmpfs(dir: &std::path::Path, size: &str) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                dir.to_str().unwrap(),
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "cannot mount a tmpfs at {} (the fault tests need root)",
            dir.display()
        );
        Mount(dir.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_filesystem_is_space_allocation_failed_and_other_luns_keep_serving() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    let _mount = Mount::tmpfs(&small, "1m");
    let lun0 = format!("{}:16M", small.join("thin.img").display());
    let server = Server::start(&[&lun0, "ram:8M"]);
    let s = session(&server).await;
    let chunk = Bytes::from(vec![0x5au8; 64 << 10]);
    let mut full = None;
    for i in 0..64u64 {
        let r = s
            .write16(0, i * 128, chunk.clone(), 512, false)
            .await
            .unwrap();
        if r.status != 0 {
            full = Some((i, r.sense_key()));
            break;
        }
    }
    let (at, sense) = full.expect("a 16 MiB thin LUN on a 1 MiB filesystem never ran out of space");
    assert!(at >= 4, "failed too early, at chunk {at}");
    assert_eq!(
        sense,
        Some((0x7, 0x27, 0x07)),
        "want DATA PROTECT / SPACE ALLOCATION FAILED"
    );
    // What was written before is intact; the other LUN works; the server lives.
    let r = s.read16(0, 0, 128, 512).await.unwrap();
    assert!(
        r.status == 0 && r.data == chunk[..],
        "data written before the filesystem filled changed"
    );
    let r = s.write16(1, 0, chunk.clone(), 512, true).await.unwrap();
    assert_eq!(r.status, 0, "the other LUN stopped serving");
    let r = s.read16(1, 0, 128, 512).await.unwrap();
    assert!(r.status == 0 && r.data == chunk[..]);
    // Freeing space (UNMAP of what was written) makes writes work again.
    let mut param = vec![0u8, 22, 0, 16, 0, 0, 0, 0];
    param.extend_from_slice(&0u64.to_be_bytes());
    param.extend_from_slice(&((at as u32) * 128).to_be_bytes());
    param.extend_from_slice(&[0; 4]);
    let r = s
        .command(
            0,
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            Bytes::from(param),
            0,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 0, "UNMAP: {:?}", r.sense_key());
    let r = s.write16(0, 0, chunk.clone(), 512, true).await.unwrap();
    assert_eq!(
        r.status,
        0,
        "writes after UNMAP freed space: {:?}",
        r.sense_key()
    );
    let _ = s.logout().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let mut server = Server::start(&[&format!("{}:64M", path.display())]);
    let s = session(&server).await;
    // 32 writers, each writing its own blocks with a pattern naming the
    // block and the round, half of them with FUA; every acknowledged write
    // is recorded. The server is killed while they run.
    let acked: Arc<Mutex<Vec<(u64, u8)>>> = Arc::default();
    // Notified when KILL_AFTER writes have been acknowledged.
    const KILL_AFTER: usize = 400;
    let enough = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for w in 0..32u64 {
        let (s, acked, enough) = (s.clone(), acked.clone(), enough.clone());
        tasks.push(tokio::spawn(async move {
            for round in 1..=255u8 {
                let lba = (w * 4096 + u64::from(round) * 8) % (64 << 11);
                let mut block = vec![round; 4096];
                block[..8].copy_from_slice(&lba.to_be_bytes());
                match s
                    .write16(0, lba, Bytes::from(block), 512, round % 2 == 0)
                    .await
                {
                    Ok(r) if r.status == 0 => {
                        let mut a = acked.lock().unwrap();
                        a.push((lba, round));
                        if a.len() == KILL_AFTER {
                            enough.notify_one();
                        }
                    }
                    _ => return,
                }
            }
        }));
    }
    // Killed while the writers run, once KILL_AFTER writes are acknowledged.
    tokio::time::timeout(Duration::from_secs(30), enough.notified())
        .await
        .expect("writes acknowledged within 30 s");
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    for t in tasks {
        let _ = t.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "too few writes before the kill ({})",
        acked.len()
    );
    let file = std::fs::read(&path).unwrap();
    for (lba, round) in &acked {
        let at = (*lba * 512) as usize;
        let block = &file[at..at + 4096];
        assert_eq!(
            &block[..8],
            &lba.to_be_bytes(),
            "acknowledged block at LBA {lba} missing after kill -9"
        );
        assert!(
            block[8..].iter().all(|b| b == round),
            "acknowledged block at LBA {lba} (round {round}) not on disk"
        );
    }
    println!(
        "{} acknowledged writes, all on disk after kill -9",
        acked.len()
    );
}
