//! The decode hot path allocates nothing once warm: a counting global allocator watches
//! 20 single-token decode steps of a small synthetic BitNet model.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use ternion::model;
use ternion::quant::GgmlType;
use ternion::session::Session;
use ternion_testkit::synth::{self, Shape, Spec, Vocab};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    let path = std::env::temp_dir().join(format!("ternion-noalloc-{}.gguf", std::process::id()));
    for ty in [GgmlType::I2_S, GgmlType::TQ2_0] {
        synth::write(
            &Spec {
                arch: "bitnet-b1.58",
                shape: Shape::named("tiny").unwrap(),
                weight_type: ty,
                vocab: Vocab::Bytes { n_vocab: 1000 },
                seed: 3,
            },
            &path,
        )
        .unwrap();
        let (_file, m) = model::load(&path).unwrap();
        let mut s = Session::new(&m, 64);
        s.prefill(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        for t in 0..3 {
            s.decode(10 + t).unwrap();
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        for t in 0..20 {
            s.decode(20 + t).unwrap();
        }
        let n = ALLOCS.load(Ordering::Relaxed) - before;
        assert_eq!(n, 0, "{ty}: {n} allocations in 20 decode steps");
    }
    std::fs::remove_file(&path).ok();
}
