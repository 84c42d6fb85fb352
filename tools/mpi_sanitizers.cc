// The sanitizers' view of OpenMPI, built into every binary that links MPI
// (//runtime:communicator depends on this), so a rank launched by any
// mpirun (a test's, a repro's, a user's) is checked the same way under
// --config=asan and --config=tsan with no options to pass. Without a
// sanitizer nothing calls these.
//
// Each suppression is memory that a library we do not build keeps until
// exit, by design:
//   - OpenMPI allocates its operation tables, MCA component state and
//     communicator caches at MPI_Init and frees some of them only at
//     process teardown, after LSan's check (ompi_op_base_op_select and the
//     dlopen'ed components, which LSan sees as "<unknown module>" once they
//     are closed);
//   - OpenMPI's progress thread allocates inside libevent's loop and is
//     stopped, not joined, at MPI_Finalize;
//   - UBSan's runtime caches symbolized type names for its reports.
// memwall's own allocations are never suppressed: every entry names a
// module, and a leak is suppressed only when such a module allocated it.

extern "C" {

const char* __lsan_default_suppressions() {
  return "leak:libmpi.so\n"
         "leak:libopen-pal.so\n"
         "leak:libopen-rte.so\n"
         "leak:libevent_core\n"
         "leak:<unknown module>\n"
         "leak:libubsan.so\n";
}

// The libraries above have no frame pointers: the fast unwinder stops in
// them, and a truncated stack matches no entry. Full stacks for allocations.
const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

// ThreadSanitizer: OpenMPI is not built with it, so TSan sees only the
// memory accesses of our code and the interceptors (malloc, pthread) that
// OpenMPI calls. Its progress thread and shared-memory transport
// synchronize through atomics and memory TSan cannot see, which shows as
// races inside the libraries. called_from_lib ignores the interceptors
// those libraries call; a race with memwall's own accesses on both sides is
// still reported.
// The components OpenMPI dlopens (mca_*.so) and the PMIx client one of
// them loads are the same case, but they are unloaded at MPI_Finalize,
// which called_from_lib does not allow (TSan stops the process): their
// reports are suppressed by kind instead, a race or a mutex misuse with one
// of their frames on the stack. OpenBLAS's worker threads meet the caller
// through spin flags TSan cannot see either: a block of C they write looks
// racy against its allocation.
const char* __tsan_default_suppressions() {
  return "called_from_lib:libmpi.so\n"
         "called_from_lib:libopen-pal.so\n"
         "called_from_lib:libopen-rte.so\n"
         "called_from_lib:libevent_core\n"
         "called_from_lib:libevent_pthreads\n"
         "race:libpmix.so\n"
         "mutex:libpmix.so\n"
         "race:mca_errmgr_default_app.so\n"
         "race:mca_pmix_ext3x.so\n"
         "race:mca_allocator_bucket.so\n"
         "mutex:mca_pml_ob1.so\n"
         "race:libopenblas.so\n";
}

}  // extern "C"
