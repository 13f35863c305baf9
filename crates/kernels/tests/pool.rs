//! Thread pool tests: every index exactly once, any thread count, nesting, panics, concurrent
//! callers, and the safe mutable-chunk split.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokenmill_kernels::pool::{ThreadPool, global, parallel_chunks_mut, set_num_threads};

fn counts(n: usize) -> Vec<AtomicUsize> {
    (0..n).map(|_| AtomicUsize::new(0)).collect()
}

fn assert_once(c: &[AtomicUsize], what: &str) {
    for (i, c) in c.iter().enumerate() {
        assert_eq!(c.load(Ordering::Relaxed), 1, "{what}: index {i}");
    }
}

#[test]
fn every_index_exactly_once_on_any_thread_count() {
    for threads in [1, 2, 3, 8] {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.num_threads(), threads);
        for n in [0, 1, 2, 3, 17, 100, 10_007] {
            // Reuse the pool many times: jobs must not leak into each other.
            for _ in 0..3 {
                let c = counts(n);
                pool.parallel_for(n, |i| {
                    c[i].fetch_add(1, Ordering::Relaxed);
                });
                assert_once(&c, &format!("{threads} threads, {n} tasks"));
            }
        }
    }
}

#[test]
fn zero_threads_means_one() {
    let pool = ThreadPool::new(0);
    assert_eq!(pool.num_threads(), 1);
    let c = counts(5);
    pool.parallel_for(5, |i| {
        c[i].fetch_add(1, Ordering::Relaxed);
    });
    assert_once(&c, "0 threads");
}

#[test]
fn work_is_spread_over_threads() {
    let pool = ThreadPool::new(2);
    let ids = Mutex::new(std::collections::HashSet::new());
    // Tasks long enough that the worker wakes up and claims some.
    pool.parallel_for(64, |_| {
        std::thread::sleep(std::time::Duration::from_millis(1));
        ids.lock().unwrap().insert(std::thread::current().id());
    });
    assert_eq!(ids.lock().unwrap().len(), 2);
}

#[test]
fn nested_calls_run_inline_and_complete() {
    let pool = ThreadPool::new(3);
    let c = counts(20 * 30);
    pool.parallel_for(20, |i| {
        pool.parallel_for(30, |j| {
            c[i * 30 + j].fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_once(&c, "nested");
}

#[test]
fn concurrent_callers_share_one_pool() {
    let pool = ThreadPool::new(2);
    std::thread::scope(|s| {
        for caller in 0..4 {
            let pool = &pool;
            s.spawn(move || {
                for round in 0..50 {
                    let n = 1 + (caller * 7 + round) % 40;
                    let c = counts(n);
                    pool.parallel_for(n, |i| {
                        c[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert_once(&c, "concurrent");
                }
            });
        }
    });
}

#[test]
fn a_panicking_task_panics_the_caller_and_the_pool_survives() {
    for threads in [1, 2, 4] {
        let pool = ThreadPool::new(threads);
        for bad in [0, 7, 99] {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.parallel_for(100, |i| {
                    if i == bad {
                        panic!("task {i} failed");
                    }
                });
            }));
            let msg = r.expect_err("the panic reaches the caller");
            let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert_eq!(msg, format!("task {bad} failed"));
            // Still usable, and still exactly once.
            let c = counts(1000);
            pool.parallel_for(1000, |i| {
                c[i].fetch_add(1, Ordering::Relaxed);
            });
            assert_once(&c, "after a panic");
        }
    }
}

#[test]
fn chunks_mut_cover_the_buffer_once() {
    let pool = ThreadPool::new(3);
    for (len, chunk) in [(0, 4), (1, 4), (10, 3), (1000, 64), (1000, 1000), (5, 100)] {
        let mut v = vec![0u32; len];
        parallel_chunks_mut(&pool, &mut v, chunk, |i, c| {
            for (j, x) in c.iter_mut().enumerate() {
                *x += (i * chunk + j) as u32 + 1;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
    }
}

#[test]
fn global_pool_keeps_its_thread_count() {
    let n = global().num_threads();
    assert!(n >= 1);
    assert!(set_num_threads(n));
    assert!(!set_num_threads(n + 1));
    let c = counts(33);
    global().parallel_for(33, |i| {
        c[i].fetch_add(1, Ordering::Relaxed);
    });
    assert_once(&c, "global");
}

#[test]
fn dropping_a_pool_joins_its_workers() {
    for _ in 0..20 {
        let pool = ThreadPool::new(4);
        let c = counts(10);
        pool.parallel_for(10, |i| {
            c[i].fetch_add(1, Ordering::Relaxed);
        });
        drop(pool);
        assert_once(&c, "before drop");
    }
}

#[test]
fn warm_up_returns_and_the_pool_keeps_working() {
    for threads in [1, 2, 4] {
        let pool = ThreadPool::new(threads);
        // Returns (at the latest after its 1 s deadline) and leaves the pool usable.
        pool.warm_up();
        let ids = Mutex::new(Vec::new());
        pool.parallel_for(threads, |_| {
            ids.lock().unwrap().push(std::thread::current().id());
        });
        assert_eq!(ids.into_inner().unwrap().len(), threads);
    }
}
