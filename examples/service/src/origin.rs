//! The origin: PostgreSQL. Creates its own database and tables, reads and
//! writes items, and counts the reads the cache exists to save.
//!
//! Every origin read is one statement that also inserts a row into
//! `origin_reads`, so the count comes from PostgreSQL itself, whichever
//! process made the query. The table is UNLOGGED and insert-only: no row
//! that concurrent reads would queue on (a `counter = counter + 1` row
//! would serialize the no-cache comparison on its row lock), and no WAL
//! flush at commit.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde::{Deserialize, Serialize};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

/// One row of `items`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub id: i64,
    pub name: String,
    pub price_cents: i64,
    /// Incremented by every update.
    pub version: i64,
}

/// The fields a `PUT` may change.
#[derive(Debug, Clone, Deserialize)]
pub struct ItemUpdate {
    pub name: String,
    pub price_cents: i64,
}

/// What can go wrong talking to PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    // The causes are in the message (`with_causes`), for the HTTP answer
    // and the log line alike; no `#[source]`, or a chain would repeat them.
    #[error("postgres: {}", with_causes(.0))]
    Postgres(tokio_postgres::Error),
    #[error("no connection from the pool: {}", with_causes(.0))]
    Pool(deadpool_postgres::PoolError),
    #[error("bad database URL: {0}")]
    Config(String),
}

/// `error: cause: cause's cause`, skipping a cause whose message the
/// previous one already ends with.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let message = c.to_string();
        if !out.ends_with(&message) {
            out.push_str(": ");
            out.push_str(&message);
        }
        cause = c.source();
    }
    out
}

impl From<tokio_postgres::Error> for OriginError {
    fn from(e: tokio_postgres::Error) -> Self {
        OriginError::Postgres(e)
    }
}

impl From<deadpool_postgres::PoolError> for OriginError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        OriginError::Pool(e)
    }
}

/// Origin reads counted from PostgreSQL: in all, and for the most-read
/// items.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OriginCounts {
    pub reads_total: i64,
    /// `(item id, reads)`, most read first, at most 20.
    pub reads_by_item: Vec<(i64, i64)>,
}

/// The loader's statement: one round trip that reads the item and counts
/// the read.
const READ_ITEM: &str = "WITH counted AS (INSERT INTO origin_reads (item_id) VALUES ($1)) \
     SELECT id, name, price_cents, version FROM items WHERE id = $1";

const UPDATE_ITEM: &str = "UPDATE items SET name = $2, price_cents = $3, version = version + 1 \
     WHERE id = $1 RETURNING id, name, price_cents, version";

/// Schema and seed, idempotent; run under an advisory lock so that
/// processes started together do not race on `CREATE TABLE IF NOT EXISTS`
/// (which can fail on a concurrent create).
const SETUP: &str = "
CREATE TABLE IF NOT EXISTS items (
    id          bigint PRIMARY KEY,
    name        text   NOT NULL,
    price_cents bigint NOT NULL,
    version     bigint NOT NULL DEFAULT 1
);
CREATE UNLOGGED TABLE IF NOT EXISTS origin_reads (
    item_id bigint      NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);";

/// The longest a request waits for a pooled connection, or for a new one.
const POOL_TIMEOUT: Duration = Duration::from_secs(10);

/// Any number: it only has to be the same in every process.
const SETUP_LOCK: i64 = 0x0E_F111;

/// The database: a pool, and what this process adds to each read.
#[derive(Clone)]
pub struct Origin {
    pool: Pool,
    delay: Duration,
    database: String,
}

impl Origin {
    /// Connects, creating the URL's database if it is missing, then the
    /// tables, and seeds items `1..=items` (rows that exist are kept).
    pub async fn connect(
        url: &str,
        pool_size: usize,
        items: i64,
        delay: Duration,
    ) -> Result<Origin, OriginError> {
        let config = tokio_postgres::Config::from_str(url)
            .map_err(|e| OriginError::Config(e.to_string()))?;
        let database = config
            .get_dbname()
            .map(str::to_owned)
            .or_else(|| config.get_user().map(str::to_owned))
            .ok_or_else(|| OriginError::Config("the URL names no database".into()))?;
        create_database_if_missing(&config, &database).await?;

        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // Bounded waits for a connection: without them a request queues
        // forever behind a saturated pool (in `--no-cache` mode nothing
        // else bounds it).
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_TIMEOUT))
            .create_timeout(Some(POOL_TIMEOUT))
            .build()
            .map_err(|e| OriginError::Config(e.to_string()))?;
        let mut client = pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SETUP_LOCK])
            .await?;
        tx.batch_execute(SETUP).await?;
        tx.execute(
            "INSERT INTO items (id, name, price_cents) \
             SELECT g, 'item ' || g, g * 100 FROM generate_series(1, $1::bigint) g \
             ON CONFLICT (id) DO NOTHING",
            &[&items],
        )
        .await?;
        tx.commit().await?;
        drop(client);
        Ok(Origin {
            pool,
            delay,
            database,
        })
    }

    /// The database's name.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Reads one item (`None`: no such row), counted in `origin_reads`.
    pub async fn read_item(&self, id: i64) -> Result<Option<Item>, OriginError> {
        let client = self.pool.get().await?;
        if !self.delay.is_zero() {
            // A heavier query: the connection is held meanwhile.
            tokio::time::sleep(self.delay).await;
        }
        let statement = client.prepare_cached(READ_ITEM).await?;
        let row = client.query_opt(&statement, &[&id]).await?;
        metrics::counter!("service_origin_reads_total").increment(1);
        Ok(row.map(|row| Item {
            id: row.get(0),
            name: row.get(1),
            price_cents: row.get(2),
            version: row.get(3),
        }))
    }

    /// Updates one item; `None` if there is no such row.
    pub async fn update_item(
        &self,
        id: i64,
        update: &ItemUpdate,
    ) -> Result<Option<Item>, OriginError> {
        let client = self.pool.get().await?;
        let statement = client.prepare_cached(UPDATE_ITEM).await?;
        let row = client
            .query_opt(&statement, &[&id, &update.name, &update.price_cents])
            .await?;
        Ok(row.map(|row| Item {
            id: row.get(0),
            name: row.get(1),
            price_cents: row.get(2),
            version: row.get(3),
        }))
    }

    /// The origin reads so far, from PostgreSQL (every process's).
    pub async fn counts(&self) -> Result<OriginCounts, OriginError> {
        let client = self.pool.get().await?;
        let total = client
            .query_one("SELECT count(*) FROM origin_reads", &[])
            .await?
            .get(0);
        let by_item = client
            .query(
                "SELECT item_id, count(*) FROM origin_reads \
                 GROUP BY item_id ORDER BY count(*) DESC, item_id LIMIT 20",
                &[],
            )
            .await?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        Ok(OriginCounts {
            reads_total: total,
            reads_by_item: by_item,
        })
    }

    /// `SELECT 1` through the pool.
    pub async fn ping(&self) -> Result<(), OriginError> {
        let client = self.pool.get().await?;
        client.query_one("SELECT 1", &[]).await?;
        Ok(())
    }
}

/// `CREATE DATABASE` through the server's `postgres` database, unless the
/// database exists. Processes starting together may both try: the loser's
/// "already exists" (or the catalog's unique violation) is success.
async fn create_database_if_missing(
    config: &tokio_postgres::Config,
    database: &str,
) -> Result<(), OriginError> {
    let mut admin = config.clone();
    admin.dbname("postgres");
    let (client, connection) = admin.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&database])
        .await?
        .is_some();
    if !exists {
        let create = format!("CREATE DATABASE {}", quote_identifier(database));
        match client.batch_execute(&create).await {
            Ok(()) => {}
            Err(e)
                if e.code() == Some(&SqlState::DUPLICATE_DATABASE)
                    || e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {}
            Err(e) => return Err(e.into()),
        }
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}

/// A PostgreSQL identifier in double quotes (embedded quotes doubled).
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_told_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped: refused")]
        struct Wrapped(#[source] std::io::Error);
        let refused = || std::io::Error::other("refused");
        assert_eq!(with_causes(&Outer(refused())), "outer: refused");
        // A message that already ends with its cause's does not repeat it.
        assert_eq!(with_causes(&Wrapped(refused())), "wrapped: refused");
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_identifier("onefill_service"), "\"onefill_service\"");
        assert_eq!(quote_identifier("a\"b; DROP"), "\"a\"\"b; DROP\"");
    }
}
