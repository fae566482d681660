//! `#[onefill::cached]` on an async function and on a plain one: a
//! hundred concurrent callers of each make one query.
//!
//! ```sh
//! cargo run -p onefill --example cached --features macros
//! ```
//!
//! On Redis instead of the embedded backend, declare
//! `onefill::default_backend!(onefill::DefaultBackend::redis_from_env());`
//! and run with `ONEFILL_REDIS_URL=redis://127.0.0.1:6379`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// The backend of every cached function of this crate that names no cache.
onefill::default_backend!(onefill::MemoryBackend::new());

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct User {
    id: u64,
    name: String,
}

/// Stands for a connection pool (`sqlx::PgPool`, `r2d2::Pool`…): a cheap
/// `Clone` handle that counts its queries.
#[derive(Clone, Default)]
struct Db {
    queries: Arc<AtomicUsize>,
}

impl Db {
    async fn user(&self, id: u64) -> anyhow::Result<User> {
        self.queries.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(User {
            id,
            name: format!("user {id}"),
        })
    }

    fn country(&self, code: &str) -> Option<String> {
        self.queries.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
        (code == "fr").then(|| "France".to_owned())
    }

    fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
}

/// One cache entry per `id` (the pool is not part of the key), fresh for
/// five minutes, then served stale for one more while a refresh runs.
#[onefill::cached(ttl = "5m", grace = "1m", skip(db))]
async fn user(id: u64, db: &Db) -> anyhow::Result<User> {
    db.user(id).await
}

/// A plain function: its callers block, its body runs on a blocking
/// thread. `None` is cached too (an unknown code is not looked up again).
#[onefill::cached(ttl = "1h", skip(db))]
fn country_name(code: &str, db: &Db) -> Option<String> {
    db.country(code)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let db = Db::default();

    let started = Instant::now();
    let callers: Vec<_> = (0..100)
        .map(|_| {
            let db = db.clone();
            tokio::spawn(async move { user(42, &db).await })
        })
        .collect();
    for caller in callers {
        caller.await??;
    }
    println!(
        "async: 100 callers of user(42) in {:?}; queries: {}",
        started.elapsed(),
        db.queries()
    );

    let db = Db::default();
    let started = Instant::now();
    let threads: Vec<_> = (0..100)
        .map(|i| {
            let db = db.clone();
            let code = if i % 2 == 0 { "fr" } else { "xx" };
            std::thread::spawn(move || (code, country_name(code, &db)))
        })
        .collect();
    for thread in threads {
        let Ok((code, name)) = thread.join() else {
            anyhow::bail!("a caller thread panicked");
        };
        assert_eq!(name.is_some(), code == "fr");
    }
    println!(
        "sync: 100 threads of country_name(\"fr\" | \"xx\") in {:?}; queries: {} (one per code)",
        started.elapsed(),
        db.queries()
    );
    // Not from this async function itself: a blocking call from an async
    // task would stall its worker, and is refused (an `Option` function
    // answers `None` then, and logs why).
    let france = tokio::task::spawn_blocking(move || country_name("fr", &db)).await?;
    println!("country_name(\"fr\") = {france:?}");
    Ok(())
}
