//! Memory ownership: no handle reaches memory its owner let go of.

use super::{Arena, Backend, Context, Gallocr, GgmlError, Graph};
use crate::dtype::DType;

fn backend() -> Backend {
    Backend::cpu(1).expect("cpu backend")
}

#[test]
fn a_graph_allocation_unbinds_its_tensors_when_dropped() {
    let backend = backend();
    let ctx = Context::new(8, 8).expect("ctx");
    let graph = Graph::new(&ctx, 8);
    let x = ctx.new_tensor(DType::F32, [4, 1, 1, 1]).mark_input();
    let y = ctx.scale(x, 2.0).mark_output();
    graph.expand(y);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    {
        let _allocation = galloc.alloc(&graph).expect("alloc");
        x.write_f32(&[1.0, 2.0, 3.0, 4.0]).expect("input");
        backend.compute(&graph).expect("compute");
        assert_eq!(y.read_f32().expect("read"), vec![2.0, 4.0, 6.0, 8.0]);
    }
    // The buffer may now serve another graph: the old handles no longer reach it.
    assert!(matches!(y.read_f32(), Err(GgmlError::Unbound(_))));
    assert!(matches!(x.write_f32(&[0.0; 4]), Err(GgmlError::Unbound(_))));
    assert!(matches!(
        backend.compute(&graph),
        Err(GgmlError::Unbound(_))
    ));
    // A fresh allocation binds them again.
    let _allocation = galloc.alloc(&graph).expect("alloc again");
    x.write_f32(&[1.0; 4]).expect("input");
    backend.compute(&graph).expect("compute");
    assert_eq!(y.read_f32().expect("read"), vec![2.0; 4]);
}

#[test]
fn compute_refuses_tensors_without_memory() {
    let backend = backend();
    let ctx = Context::new(8, 8).expect("ctx");
    let graph = Graph::new(&ctx, 8);
    let x = ctx.new_tensor(DType::F32, [4, 1, 1, 1]);
    graph.expand(ctx.scale(x, 2.0));
    let e = backend.compute(&graph).expect_err("nothing is allocated");
    assert!(e.to_string().contains("no memory"), "{e}");
}

#[test]
fn a_bound_buffer_unbinds_its_tensors_when_dropped() {
    let backend = backend();
    let ctx = Context::new(8, 8).expect("ctx");
    let a = ctx.new_tensor(DType::F32, [2, 1, 1, 1]);
    let view = ctx.view(a, [1, 1, 1, 1], [4, 4, 4], 4);
    {
        let _buf = backend.alloc_tensors(&[a], "pins").expect("alloc");
        a.write_f32(&[5.0, 6.0]).expect("write");
        assert_eq!(a.read_f32().expect("read"), vec![5.0, 6.0]);
        assert!(
            backend.alloc_tensors(&[a], "again").is_err(),
            "already bound"
        );
    }
    assert!(matches!(a.read_bytes(), Err(GgmlError::Unbound(_))));
    assert!(matches!(view.read_bytes(), Err(GgmlError::Unbound(_))));
}

#[test]
fn a_view_of_a_moved_base_is_refused() {
    let backend = backend();
    let arena = Arena::new(1).expect("arena");
    let w = arena.add(DType::F32, [4, 1, 1, 1], "w").expect("room");
    arena.allocate_host(&backend, "weights").expect("alloc");
    arena
        .get(w)
        .write_f32(&[1.0, 2.0, 3.0, 4.0])
        .expect("write");
    let ctx = Context::new(8, 8).expect("ctx");
    let graph = Graph::new(&ctx, 8);
    let view = ctx.view(arena.get(w), [2, 1, 1, 1], [8, 8, 8], 8);
    let y = ctx.scale(view, 1.0).mark_output();
    graph.expand(y);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc");
    backend.compute(&graph).expect("compute");
    assert_eq!(y.read_f32().expect("read"), vec![3.0, 4.0]);
    // The base moves to a replica: the view still points at the old place.
    let replica = arena.replicate(&backend, &[w], None).expect("replica");
    let e = backend.compute(&graph).expect_err("stale view");
    assert!(e.to_string().contains("moved"), "{e}");
    view.refresh_view().expect("refresh");
    backend.compute(&graph).expect("compute after refresh");
    arena.release(replica);
    assert!(
        backend.compute(&graph).is_err(),
        "stale again after release"
    );
}

#[test]
fn an_allocated_arena_takes_no_more_tensors() {
    let arena = Arena::new(4).expect("arena");
    assert!(arena.add(DType::F32, [1, 1, 1, 1], "a").is_some());
    arena.allocate(&backend(), "test").expect("alloc");
    assert!(arena.add(DType::F32, [1, 1, 1, 1], "b").is_none());
    assert!(arena.allocate(&backend(), "twice").is_err());
    assert!(arena.buffer_size() >= 4);
}

#[test]
fn only_a_cpu_backend_gives_the_cpu_kernels() {
    let cpu = backend();
    assert_eq!(
        cpu.cpu_kernels().is_some(),
        super::blocked_gemm_available(DType::F32)
    );
    for d in super::list_devices()
        .into_iter()
        .filter(|d| d.kind != super::DeviceKind::Cpu)
    {
        if let Ok(b) = Backend::by_name(&d.name, 1) {
            assert!(b.cpu_kernels().is_none(), "{}", d.name);
        }
    }
}
