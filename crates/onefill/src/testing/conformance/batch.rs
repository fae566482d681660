//! Batches: the batch steps (`get_many`, `acquire_many`) answer each key
//! as the single-key steps would, and a herd of batches loads each key
//! once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::backend::{Acquired, FillKeys, LeaseRequest};
use crate::testing::{cache, unique_ns, Harness};
use crate::LeaseToken;

scenarios! { $ __onefill_conformance_batch;

    /// `get_many` and `acquire_many` answer each key, in order, as `get`
    /// and `acquire` would: a fresh value, a lease held by another, a free
    /// lease (won, with our token); no keys, no answers.
    pub async fn batch_steps_answer_each_key_in_order(h: &dyn Harness) {
        let ns = unique_ns("batch-steps");
        let backend = h.backend().await;
        let c = cache(h, &ns).await;
        c.set("fresh", "v".to_owned()).await.expect("set");
        let keys = |k: &str| FillKeys::new(&ns, k);
        let other = LeaseToken::random();
        let lease = Duration::from_secs(5);
        assert!(matches!(
            backend.acquire(&keys("held"), &other, lease, Duration::ZERO).await,
            Ok(Acquired::Won { .. })
        ));

        assert!(backend.get_many(&[]).await.is_empty());
        assert!(backend.acquire_many(&[], lease).await.is_empty());
        let read = backend
            .get_many(&[keys("free"), keys("fresh"), keys("held")])
            .await;
        assert!(matches!(read[0], Ok(None)), "{read:?}");
        assert!(matches!(&read[1], Ok(Some(s)) if !s.bytes.is_empty()), "{read:?}");
        assert!(matches!(read[2], Ok(None)), "{read:?}");

        let requests: Vec<LeaseRequest> = ["free", "fresh", "held"]
            .iter()
            .map(|k| LeaseRequest::new(keys(k), LeaseToken::random(), Duration::ZERO))
            .collect();
        let acquired = backend.acquire_many(&requests, lease).await;
        assert!(matches!(acquired[0], Ok(Acquired::Won { stale: None })), "{acquired:?}");
        assert!(matches!(acquired[1], Ok(Acquired::Fresh(_))), "{acquired:?}");
        assert!(matches!(acquired[2], Ok(Acquired::Held { .. })), "{acquired:?}");
        // The lease won is ours: our token fills it, the other's does not.
        assert!(!backend.fill(&keys("free"), &other, b"x", lease).await.expect("fill"));
        assert!(backend
            .release(&keys("free"), &requests[0].token, None)
            .await
            .expect("release"));
        assert!(backend.release(&keys("held"), &other, None).await.expect("release"));
    }

    /// Three processes ask for the same 20 cold keys at once, in batches:
    /// each key is loaded once, in at most three loader calls.
    pub async fn a_herd_of_batches_loads_each_key_once(h: &dyn Harness) {
        let ns = unique_ns("batch-herd");
        let mut pods = Vec::new();
        for _ in 0..3 {
            pods.push(cache(h, &ns).await);
        }
        let wanted: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let loaded: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let calls = pods.iter().map(|c| {
            let c = c.clone();
            let wanted = wanted.clone();
            let loaded = loaded.clone();
            tokio::spawn(async move {
                c.get_or_load_many(&wanted, move |keys: Vec<String>| {
                    loaded.lock().push(keys.clone());
                    async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let found: HashMap<String, String> =
                            keys.into_iter().map(|k| (k.clone(), format!("v{k}"))).collect();
                        Ok::<_, std::io::Error>(found)
                    }
                })
                .await
            })
        });
        for call in calls.collect::<Vec<_>>() {
            let found = call.await.expect("no panic").expect("an answer");
            assert_eq!(found.len(), 20);
            assert!(wanted.iter().all(|k| found[k] == format!("v{k}")));
        }
        let loaded = loaded.lock();
        assert!(loaded.len() <= 3, "{} loader calls", loaded.len());
        let mut per_key: HashMap<&String, usize> = HashMap::new();
        for k in loaded.iter().flatten() {
            *per_key.entry(k).or_default() += 1;
        }
        assert_eq!(per_key.len(), 20);
        assert!(per_key.values().all(|n| *n == 1), "{per_key:?}");
    }
}
