//! The blocking handle where synchronous code meets it: plain threads,
//! `spawn_blocking`, async tasks of either runtime flavour, a panicking
//! loader, a herd that fills the blocking pool. (Its guarantees under
//! contention and faults are the conformance suite's, run through it on
//! Redis in `redis_conformance.rs`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use onefill::{BlockingCache, Cache, Error, Outcome};

fn cache(ns: &str) -> BlockingCache<u64, String> {
    Cache::builder()
        .namespace(ns)
        .build_blocking()
        .expect("a blocking cache")
}

#[test]
fn sixty_four_threads_on_a_cold_key_are_one_load() {
    let cache = cache("threads");
    let loads = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(64));
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (cache, loads, start) = (cache.clone(), loads.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                cache.fetch(&1, move |id| {
                    loads.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                    Ok::<_, std::io::Error>(format!("user {id}"))
                })
            })
        })
        .collect();
    let mut loaded = 0;
    for thread in threads {
        let fetched = thread.join().expect("a caller thread").expect("an answer");
        assert_eq!(fetched.value, "user 1");
        loaded += usize::from(fetched.outcome == Outcome::Loaded);
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert!(loaded >= 1);
    assert_eq!(cache.stats().loads_ok, 1);
}

#[test]
fn the_loader_runs_on_a_loader_thread_inside_the_driving_runtime() {
    let cache = cache("where");
    let (thread, in_runtime) = cache
        .get_or_load(&1, |_| {
            let thread = std::thread::current().name().map(str::to_owned);
            let in_runtime = tokio::runtime::Handle::try_current().is_ok();
            Ok::<_, std::io::Error>(format!("{thread:?} {in_runtime}"))
        })
        .map(|answer| {
            let (thread, in_runtime) = answer.rsplit_once(' ').expect("two words");
            (thread.to_owned(), in_runtime == "true")
        })
        .expect("an answer");
    assert_eq!(thread, "Some(\"onefill-loader\")", "not an async worker");
    assert!(in_runtime, "Handle::current() works in the loader");
}

#[test]
fn a_panicking_loader_is_an_error_for_every_caller() {
    let cache = cache("panics");
    let err = cache
        .get_or_load(&1, |_| -> Result<String, std::io::Error> { panic!("boom") })
        .expect_err("the loader panicked");
    assert!(
        matches!(&err, Error::LoaderPanicked(m) if m.contains("boom")),
        "{err:?}"
    );
    // Nothing stuck: the next call loads.
    let next = cache.get_or_load(&1, |_| Ok::<_, std::io::Error>("ok".to_owned()));
    assert_eq!(next.expect("a load"), "ok");
}

#[test]
fn writes_reads_and_batches() {
    let cache = cache("verbs");
    cache.set(&1, "one".to_owned()).expect("set");
    assert_eq!(cache.get(&1).expect("get"), Some("one".to_owned()));
    cache.invalidate(&1).expect("invalidate");
    assert_eq!(cache.get(&1).expect("get"), None);
    let found = cache
        .get_or_load_many(&[1, 2, 3], |ids| {
            Ok::<_, std::io::Error>(
                ids.into_iter()
                    .map(|id| (id, format!("v{id}")))
                    .collect::<Vec<_>>(),
            )
        })
        .expect("a batch");
    assert_eq!(found.len(), 3);
    assert_eq!(found[&2], "v2");
    let absent = cache
        .get_or_load_optional(&9, |_| Ok::<_, std::io::Error>(None))
        .expect("an optional load");
    assert_eq!(absent, None);
    let options = onefill::CallOptions::new().ttl(Duration::from_secs(5));
    cache
        .with_options(&options)
        .set(&4, "four".to_owned())
        .expect("a set with options");
    assert_eq!(cache.get(&4).expect("get"), Some("four".to_owned()));
}

/// Regression: blocking loaders once ran on the driving runtime's blocking
/// pool, where the callers themselves wait (`spawn_blocking`). A herd that
/// filled it left the load queued behind the callers waiting for it, until
/// the load timeout.
#[test]
fn a_herd_filling_the_blocking_pool_still_gets_its_load() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let cache = Cache::<u64, String>::builder()
            .namespace("full-pool")
            .max_load_time(Duration::from_secs(2))
            .build()
            .expect("a cache")
            .blocking()
            .expect("a multi-thread runtime");
        let callers: Vec<_> = (0..16)
            .map(|_| {
                let cache = cache.clone();
                tokio::task::spawn_blocking(move || {
                    cache.get_or_load(&1, |_| {
                        std::thread::sleep(Duration::from_millis(50));
                        Ok::<_, std::io::Error>("v".to_owned())
                    })
                })
            })
            .collect();
        for caller in callers {
            let answer = caller.await.expect("a caller");
            assert_eq!(answer.expect("the load, not its timeout"), "v");
        }
    });
}

#[test]
fn from_a_current_thread_runtimes_task_a_call_is_refused_not_a_deadlock() {
    let blocking = cache("refused");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let in_task = tokio::spawn({
            let blocking = blocking.clone();
            async move { blocking.get(&1) }
        })
        .await
        .expect("the task");
        assert!(
            matches!(in_task, Err(Error::BlockingInAsync)),
            "{in_task:?}"
        );
        assert!(matches!(blocking.get(&1), Err(Error::BlockingInAsync)));
        // From its blocking pool, the same call waits and answers.
        let pooled = tokio::task::spawn_blocking(move || blocking.get(&1))
            .await
            .expect("the blocking task");
        assert_eq!(pooled.expect("a read"), None);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_a_multi_thread_runtimes_task_a_call_is_refused_and_from_its_pool_it_works() {
    let cache = Cache::<u64, String>::builder().build().expect("a cache");
    let blocking = cache.blocking().expect("a multi-thread runtime");
    let in_task = blocking.get_or_load(&1, |_| Ok::<_, std::io::Error>("v".to_owned()));
    assert!(
        matches!(in_task, Err(Error::BlockingInAsync)),
        "{in_task:?}"
    );
    let value = tokio::task::spawn_blocking(move || {
        blocking.get_or_load(&1, |_| Ok::<_, std::io::Error>("v".to_owned()))
    })
    .await
    .expect("the blocking task")
    .expect("an answer");
    assert_eq!(value, "v");
    // Shared with the async face.
    assert_eq!(cache.get(&1).await.expect("get"), Some("v".to_owned()));
    // The last handle of an owned runtime dropped in a task: no panic.
    drop(self::cache("owned"));
}

#[tokio::test(flavor = "current_thread")]
async fn a_current_thread_runtime_cannot_drive_a_blocking_handle() {
    let cache = Cache::<u64, String>::builder().build().expect("a cache");
    let err = cache.blocking().expect_err("refused");
    assert!(err.to_string().contains("multi-thread"), "{err}");
}

#[test]
fn a_handle_on_a_current_thread_runtime_is_refused_and_the_runtime_shut_down() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let cache = {
        let _entered = runtime.enter();
        Cache::<u64, String>::builder().build().expect("a cache")
    };
    let err = cache.into_blocking(runtime).expect_err("refused");
    assert!(err.to_string().contains("multi-thread"), "{err}");
}

/// A program without async code of its own, on Redis: it connects in a
/// runtime it then hands to the blocking handle, and calls from threads.
#[cfg(feature = "redis")]
#[test]
fn a_synchronous_program_on_redis() {
    let server = onefill_testkit::RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let cache = runtime.block_on(async {
        let backend = onefill::redis::RedisBackend::connect(&server.url())
            .await
            .expect("connect");
        Cache::<u64, String>::builder()
            .namespace("sync-program")
            .backend(backend)
            .build()
            .expect("a cache")
    });
    let users = cache
        .into_blocking(runtime)
        .expect("a multi-thread runtime");
    let loads = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (users, loads) = (users.clone(), loads.clone());
            std::thread::spawn(move || {
                users.get_or_load(&7, move |id| {
                    loads.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                    Ok::<_, std::io::Error>(format!("user {id}"))
                })
            })
        })
        .collect();
    for thread in threads {
        assert_eq!(
            thread.join().expect("a thread").expect("an answer"),
            "user 7"
        );
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    users.invalidate(&7).expect("invalidate");
    assert_eq!(users.get(&7).expect("get"), None);
}

/// Runs `body` on a thread of its own and fails the test `name` if it has
/// not returned within `limit`: these tests are about calls that could
/// hang.
fn within<T: Send + 'static>(
    name: &str,
    limit: Duration,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)));
    });
    match answer.recv_timeout(limit) {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{name}: no answer within {limit:?}"),
    }
}

/// Regression: a task's call once waited in `block_in_place`, which hands
/// the worker's tasks to a new thread of the runtime's blocking pool. With
/// synchronous callers on `spawn_blocking` filling that pool, no thread ran
/// the runtime's tasks or timers: the flight the callers waited for never
/// ended, nor did any timeout. A task's call is now refused.
#[test]
fn a_tasks_call_while_synchronous_callers_fill_the_blocking_pool_answers() {
    within(
        "a_tasks_call_while_synchronous_callers_fill_the_blocking_pool_answers",
        Duration::from_secs(20),
        || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .max_blocking_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            let (gate, closed) = std::sync::mpsc::channel::<()>();
            let closed = Arc::new(std::sync::Mutex::new(closed));
            runtime.block_on(async move {
                let cache = Cache::<u64, String>::builder()
                    .namespace("full-pool-task")
                    .max_load_time(Duration::from_secs(1))
                    .build()
                    .expect("a cache")
                    .blocking()
                    .expect("a multi-thread runtime");
                // More callers than the pool has threads, waiting for a
                // load that outlives the maximum load time.
                let callers: Vec<_> = (0..4)
                    .map(|_| {
                        let (cache, closed) = (cache.clone(), closed.clone());
                        tokio::task::spawn_blocking(move || {
                            cache.get_or_load(&1, move |_| {
                                let _ = closed.lock().map(|closed| closed.recv());
                                Ok::<_, std::io::Error>("late".to_owned())
                            })
                        })
                    })
                    .collect();
                let in_task = tokio::spawn(async move {
                    cache.get_or_load(&2, |_| Ok::<_, std::io::Error>("two".to_owned()))
                });
                let in_task = in_task.await.expect("the task");
                assert!(
                    matches!(&in_task, Ok(_) | Err(Error::BlockingInAsync)),
                    "{in_task:?}"
                );
                for caller in callers {
                    let answer = caller.await.expect("a caller");
                    assert!(matches!(answer, Err(Error::LoadTimedOut(_))), "{answer:?}");
                }
            });
            drop(gate);
        },
    );
}

/// Regression: a `LocalSet` forbids `block_in_place`, which a task's call
/// once waited in: the call panicked there.
#[test]
fn from_a_local_set_on_a_multi_thread_runtime_a_call_answers_or_is_refused() {
    within(
        "from_a_local_set_on_a_multi_thread_runtime_a_call_answers_or_is_refused",
        Duration::from_secs(10),
        || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async {
                let blocking = Cache::<u64, String>::builder()
                    .build()
                    .expect("a cache")
                    .blocking()
                    .expect("a multi-thread runtime");
                let local = tokio::task::LocalSet::new();
                let answer = local
                    .run_until(async move {
                        tokio::task::spawn_local(async move { blocking.get(&1) }).await
                    })
                    .await
                    .expect("the local task, not a panic");
                assert!(
                    matches!(answer, Ok(None) | Err(Error::BlockingInAsync)),
                    "{answer:?}"
                );
            });
        },
    );
}

/// Regression: an unconstrained task has no budget, as a blocking thread
/// has none, so the probe takes it for one; waiting in `Handle::block_on`,
/// the call then panicked (tokio refuses to block a runtime's thread). It
/// now waits, stalling that thread for the call's duration, while the
/// cache's own runtime answers it.
#[test]
fn from_an_unconstrained_task_of_a_current_thread_runtime_a_call_answers() {
    let blocking = cache("unconstrained");
    within(
        "from_an_unconstrained_task_of_a_current_thread_runtime_a_call_answers",
        Duration::from_secs(10),
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let answer =
                    tokio::spawn(tokio::task::unconstrained(async move { blocking.get(&1) }))
                        .await
                        .expect("the task, not a panic");
                assert!(matches!(answer, Ok(None)), "{answer:?}");
            });
        },
    );
}
