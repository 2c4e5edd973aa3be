//! Tests of the paged KV cache (`kv.rs`).

use super::*;

fn geo() -> KvGeometry {
    KvGeometry {
        n_layer: 2,
        n_head_kv: 3,
        head_dim: 2,
        page_size: 4,
        ty: KvType::F16,
    }
}

#[test]
fn rows_round_trip_across_pages() {
    for ty in [KvType::F16, KvType::F32] {
        round_trip(ty);
    }
}

/// Integers below 2048 are exact in F16; the F32 cache also keeps fractions.
fn round_trip(ty: KvType) {
    let frac = if ty == KvType::F32 { 0.1 } else { 0.0 };
    let pool = KvPool::new(KvGeometry { ty, ..geo() }, 8);
    let mut s = KvSeq::new(pool.clone(), 32);
    for step in [5usize, 1, 4] {
        s.reserve(step).unwrap();
        for layer in 0..2 {
            let base = s.len();
            let k: Vec<f32> = (0..step * 6)
                .map(|i| (layer * 1000 + base * 6 + i) as f32 + frac)
                .collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            s.write(layer, &k, &v);
        }
        s.advance(step);
    }
    assert_eq!(s.len(), 10);
    assert_eq!(s.n_pages(), 3);
    assert_eq!(pool.pages_in_use(), 3);
    assert_eq!(pool.geometry().page_bytes(), 2 * 2 * 4 * 6 * ty.bytes());
    for layer in 0..2 {
        let l = s.layer(layer);
        for p in 0..10 {
            for c in 0..6 {
                let want = (layer * 1000 + p * 6 + c) as f32 + frac;
                let (h, e) = (c / 2, c % 2);
                assert_eq!(l.key(p, h).get(e), want, "{ty:?} layer {layer} pos {p}");
                assert_eq!(l.value(p, h).get(e), -want);
            }
        }
        // A head's rows of a page lie one after the other: position 4's and 5's keys of
        // head 1 from position 4 (the second page starts at position 4).
        let run = l.keys_from(4, 1);
        assert_eq!(run.len(), 4 * 2, "to the end of the page");
        assert_eq!(run.get(2), (layer * 1000 + 5 * 6 + 2) as f32 + frac);
    }
}

#[test]
fn truncate_and_drop_return_pages_and_pages_are_reused() {
    let pool = KvPool::new(geo(), 4);
    let mut a = KvSeq::new(pool.clone(), 100);
    a.reserve(13).unwrap();
    a.advance(13);
    assert_eq!(pool.pages_in_use(), 4);
    a.truncate(5);
    assert_eq!((a.len(), a.n_pages(), pool.pages_in_use()), (5, 2, 2));
    let mut b = KvSeq::new(pool.clone(), 100);
    b.reserve(8).unwrap();
    assert_eq!(pool.pages_in_use(), 4);
    assert_eq!(pool.pages_allocated(), 4, "freed pages are reused");
    let mut ids: Vec<u32> = a.page_ids().chain(b.page_ids()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        [0, 1, 2, 3],
        "page ids are unique and below the capacity"
    );
    drop(a);
    drop(b);
    assert_eq!(pool.pages_in_use(), 0);
}

/// Writes position `p`'s keys (value `x`) in every layer of `s` and advances it.
fn push(s: &mut KvSeq, x: f32) {
    s.reserve(1).unwrap();
    for layer in 0..2 {
        s.write(layer, &[x; 6], &[-x; 6]);
    }
    s.advance(1);
}

#[test]
fn forks_share_full_pages_and_copy_the_partial_one_on_write() {
    let pool = KvPool::new(geo(), 6);
    let mut a = KvSeq::new(pool.clone(), 100);
    for p in 0..6 {
        push(&mut a, p as f32);
    }
    let mut b = a.fork();
    let mut c = a.fork();
    assert_eq!((b.len(), pool.pages_in_use()), (6, 2), "forks take no page");
    push(&mut b, 100.0);
    push(&mut c, 200.0);
    assert_eq!(
        pool.pages_in_use(),
        4,
        "b and c copied the shared partial page"
    );
    push(&mut a, 300.0);
    assert_eq!(
        pool.pages_in_use(),
        4,
        "a holds the partial page alone again"
    );
    let ids = |s: &KvSeq| s.page_ids().collect::<Vec<_>>();
    assert_eq!(ids(&a)[0], ids(&b)[0]);
    assert_eq!(ids(&b)[0], ids(&c)[0]);
    for (s, x) in [(&a, 300.0), (&b, 100.0), (&c, 200.0)] {
        for layer in 0..2 {
            let l = s.layer(layer);
            let keys: Vec<f32> = (0..7).map(|p| l.key(p, 1).get(0)).collect();
            assert_eq!(keys, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, x]);
            assert_eq!(l.value(6, 0).get(0), -x);
        }
    }
    drop(a);
    drop(b);
    assert_eq!(
        pool.pages_in_use(),
        2,
        "c still holds the first page and its copy"
    );
    drop(c);
    assert_eq!(pool.pages_in_use(), 0);
    let mut d = KvSeq::new(pool.clone(), 100);
    d.reserve(8).unwrap();
    let mut e = d.fork();
    assert_eq!(
        e.n_pages(),
        0,
        "a fork holds only the pages of filled positions"
    );
    assert!(matches!(
        e.reserve(20),
        Err(Error::KvPoolExhausted {
            need: 5,
            free: 4,
            ..
        })
    ));
    assert_eq!(pool.pages_in_use(), 2);
}

#[test]
fn exhausted_pool_is_an_error_and_takes_nothing() {
    let pool = KvPool::new(geo(), 3);
    let mut a = KvSeq::new(pool.clone(), 100);
    a.reserve(8).unwrap();
    let mut b = KvSeq::new(pool.clone(), 100);
    let e = b.reserve(8).unwrap_err();
    assert!(
        matches!(
            e,
            Error::KvPoolExhausted {
                need: 2,
                free: 1,
                capacity: 3
            }
        ),
        "{e}"
    );
    assert_eq!((b.n_pages(), pool.pages_in_use()), (0, 2));
    b.reserve(4).unwrap();
    assert_eq!(pool.pages_in_use(), 3);
}

#[test]
fn context_bound_is_checked_before_pages() {
    let pool = KvPool::new(geo(), 10);
    let mut s = KvSeq::new(pool.clone(), 6);
    assert!(matches!(
        s.reserve(7),
        Err(Error::ContextFull { n_ctx: 6, .. })
    ));
    assert_eq!(pool.pages_in_use(), 0);
}
