# The tape's storage (included first of the tape's parts by _core.pyx: tape_storage.pxi,
# tape.pxi, sweep.pxi, rebuild.pxi, derivatives.pxi, in the order they were one file).
# Entries live in C as a struct of arrays (33 bytes an entry: value, two partials, two
# int32 operands, a byte opcode), one allocation per array. Small lists grow by 1.2x
# (realloc). From _MAP_ENTRIES on (Linux) each array is an anonymous mapping that reserves
# address space for many more entries: the kernel gives it memory page by page as entries
# are written, and a larger reservation is made by mremap, which moves pages without
# copying them. So memory is at most 40 bytes per used entry from 64 entries on (nbytes
# counts the pages written), and growing never copies a large tape. The sweep reads only
# partials and operand indices, so it is one reversed multiply-add loop, run without the
# GIL.

cdef extern from *:
    """
    #include <stdlib.h>
    #include <string.h>
    #if defined(__linux__)
    #include <unistd.h>
    #include <sys/mman.h>
    #define EASYAD_MAPPED_ARRAYS 1
    #else
    #define EASYAD_MAPPED_ARRAYS 0
    #endif

    /* bytes an array of `bytes` takes: whole pages when it is a mapping */
    static size_t easyad_array_bytes(size_t bytes, int mapped) {
    #if EASYAD_MAPPED_ARRAYS
        if (mapped) {
            size_t page = (size_t)sysconf(_SC_PAGESIZE);
            return (bytes + page - 1) / page * page;
        }
    #endif
        return bytes;
    }

    /* give back the pages of a mapping from byte `keep` on (it stays reserved) */
    static void easyad_array_trim(void* p, size_t keep, size_t bytes) {
    #if EASYAD_MAPPED_ARRAYS
        size_t from = easyad_array_bytes(keep, 1), to = easyad_array_bytes(bytes, 1);
        if (to > from) madvise((char*)p + from, to - from, MADV_DONTNEED);
    #endif
    }

    static void easyad_array_free(void* p, size_t bytes, int mapped) {
        if (p == NULL) return;
    #if EASYAD_MAPPED_ARRAYS
        if (mapped) { munmap(p, easyad_array_bytes(bytes, 1)); return; }
    #endif
        free(p);
    }

    /* The array `old` (old_bytes, of which `used` hold entries) resized to new_bytes;
       NULL when out of memory (old is then untouched). With keep_old (a sweep without the
       GIL still reads it) the old array is copied and left for the caller to free. A
       mapping reserves address space only (MAP_NORESERVE): pages come when written. */
    static void* easyad_array_resize(void* old, size_t used, size_t old_bytes,
                                     int old_mapped, size_t new_bytes, int new_mapped,
                                     int keep_old) {
        void* p;
    #if EASYAD_MAPPED_ARRAYS
        if (old != NULL && old_mapped && new_mapped && !keep_old) {
            /* the kernel moves the pages: nothing is copied */
            p = mremap(old, easyad_array_bytes(old_bytes, 1),
                       easyad_array_bytes(new_bytes, 1), MREMAP_MAYMOVE);
            return p == MAP_FAILED ? NULL : p;
        }
        if (new_mapped) {
            p = mmap(NULL, easyad_array_bytes(new_bytes, 1), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) return NULL;
            if (used) memcpy(p, old, used);
            if (!keep_old) easyad_array_free(old, old_bytes, old_mapped);
            return p;
        }
    #endif
        if (!keep_old && !old_mapped)
            return realloc(old, new_bytes ? new_bytes : 1);   /* in place when it can */
        p = malloc(new_bytes ? new_bytes : 1);
        if (p == NULL) return NULL;
        if (used) memcpy(p, old, used);
        if (!keep_old) easyad_array_free(old, old_bytes, old_mapped);
        return p;
    }
    """
    bint EASYAD_MAPPED_ARRAYS
    size_t easyad_array_bytes(size_t bytes, int mapped) nogil
    void easyad_array_free(void* p, size_t bytes, int mapped) nogil
    void easyad_array_trim(void* p, size_t keep, size_t bytes) nogil
    void* easyad_array_resize(void* old, size_t used, size_t old_bytes, int old_mapped,
                              size_t new_bytes, int new_mapped, int keep_old) nogil


cdef enum:
    _ENTRY_BYTES = 3 * 8 + 2 * 4 + 1
    _MIN_CAPACITY = 64
    # From this capacity on the arrays are mappings; a mapping reserves _RESERVE times the
    # entries it replaces (address space only). Memory is the pages written: at most six
    # partly written pages, 6 bytes an entry here, are not entries.
    _MAP_ENTRIES = 4096
    _RESERVE = 64
    # Below this many entries a sweep takes less time than releasing the GIL costs.
    _NOGIL_MIN_ENTRIES = 2048
    _INDEX_LIMIT = 2147483647   # operand indices are int32

cdef Py_ssize_t _next_serial = 0
# One freed list's mappings, kept for the next list that grows into mappings: its pages
# are already there (a fresh mapping takes a page fault per page written, which made
# recording a new 100,000-entry list in a loop 1.6x slower). At most _SPARE_PAGES_ENTRIES
# entries' pages are kept.
cdef char* _spare[6]
cdef Py_ssize_t _spare_capacity = 0
cdef enum:
    _SPARE_PAGES_ENTRIES = 1 << 20
cdef size_t _ITEM_BYTES[6]
_ITEM_BYTES[:] = [8, 8, 8, 4, 4, 1]   # values, partial0, partial1, arg0, arg1, ops


cdef inline bint _mapped(Py_ssize_t capacity) noexcept nogil:
    return EASYAD_MAPPED_ARRAYS and capacity >= _MAP_ENTRIES


cdef Py_ssize_t _next_capacity(Py_ssize_t capacity, bint modest) noexcept nogil:
    # modest: when a large reservation failed (strict overcommit), grow by 1/8 instead
    cdef Py_ssize_t larger
    if capacity < _MIN_CAPACITY:
        return _MIN_CAPACITY
    larger = capacity + capacity // 5
    if larger < _MAP_ENTRIES or not EASYAD_MAPPED_ARRAYS:
        return larger
    if modest:
        return capacity + capacity // 8
    return max(capacity, _MAP_ENTRIES) * _RESERVE


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _reverse_sweep(const double* partial0, const double* partial1, const int32_t* arg0,
                         const int32_t* arg1, double* adjoints, Py_ssize_t lo,
                         Py_ssize_t hi) noexcept nogil:
    # entries hi down to lo; an absent or constant operand (index -1) receives nothing (its
    # partial slot holds the constant instead). Each contribution is _helpers.h's mul0
    # (the one strong zero, bit for bit: 0 * inf contributes +0.0, as a zero partial does)
    cdef Py_ssize_t i
    cdef int32_t j
    cdef double g
    for i in range(hi, lo - 1, -1):
        g = adjoints[i]
        if g == 0.0:
            continue  # nothing flows from here: skips unselected branches and dead code
        j = arg0[i]
        if j >= 0:
            adjoints[j] += mul0(partial0[i], g)
        j = arg1[i]
        if j >= 0:
            adjoints[j] += mul0(partial1[i], g)
