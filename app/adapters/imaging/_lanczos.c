/*
 * Pillow's 8-bit LANCZOS resample (Pillow 13, src/libImaging/Resample.c),
 * the same arithmetic in loops a compiler turns into SIMD.
 *
 * Pillow computes each output sample as a sum of products of 8-bit input
 * samples and 22-bit fixed-point weights, in 32-bit integers. Integer sums
 * do not depend on their order, so any loop order gives Pillow's bytes, as
 * long as the weights, their rounding and the two passes (their order, the
 * rows they cover, the rounding to 8 bits between them) are Pillow's. The
 * weights are computed here exactly as Pillow computes them (double
 * precision, the same libm sin(), the box in single precision).
 *
 * Pillow's loops run over the taps innermost, one output sample at a time.
 * Here the vertical pass runs over a whole row innermost (a multiply-add
 * per byte, 8 or more at once), and the horizontal pass over a block of
 * rows transposed into columns, so that one output column of the block is a
 * vector of 24 (RGB) or 32 (L) samples sharing one weight per tap. On a CPU
 * with AVX2 that block is written with its intrinsics (the compiler kept the
 * portable loop's sums on the stack and widened the samples one by one):
 * 2-3 times faster, the same sums.
 *
 * The module computes; app/adapters/imaging/lanczos.py decides when its
 * result is Pillow's and drives it strip by strip.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS 22
#define MAX_SUPPORT 4096.0
/* every side, in samples or rows, is less than this (lanczos.MAX_SIDE: Pillow's single precision is exact below it),
 * so no index into the tables (2 * i) and no row a block starts at (top + block) can overflow an int */
#define MAX_SIDE (1 << 24)

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* one copy for AVX2 and one for any x86-64, chosen when the module loads */
#define VECTORISED __attribute__((target_clones("avx2", "default")))
#else
#define VECTORISED
#endif

static double sinc(double x) {
    if (x == 0.0) {
        return 1.0;
    }
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos3(double x) {
    if (-3.0 <= x && x < 3.0) {
        return sinc(x) * sinc(x / 3);
    }
    return 0.0;
}

static inline uint8_t to_byte(int32_t sum) {
    int32_t v = sum >> PRECISION_BITS;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* coefficients(in_size, in0, in1, out_size) -> (weights, bounds, ksize)
 *
 * For each output sample: ksize int32 weights (22-bit fixed point, zero
 * past its count) and two ints, its first input sample and its count. */
static PyObject *coefficients(PyObject *self, PyObject *args) {
    int in_size, out_size;
    float in0, in1;
    if (!PyArg_ParseTuple(args, "iffi", &in_size, &in0, &in1, &out_size)) {
        return NULL;
    }
    if (in_size >= MAX_SIDE || out_size >= MAX_SIDE) {
        PyErr_SetString(PyExc_ValueError, "sides too large");
        return NULL;
    }
    if (in_size < 1 || out_size < 1 || !(in1 > in0)) {
        PyErr_SetString(PyExc_ValueError, "empty resample");
        return NULL;
    }
    if (!(in0 >= 0) || !(in1 <= in_size)) { /* as Pillow refuses it; outside, the first samples overflowed an int */
        PyErr_SetString(PyExc_ValueError, "box outside the input");
        return NULL;
    }
    double scale = (double)(in1 - in0) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 3.0 * filterscale;
    double inverse = 1.0 / filterscale;
    double ceiled = ceil(support);
    /* the renderer reduces by less than 4x (ksize 25 at most); anything far beyond is refused, not allocated */
    if (ceiled > MAX_SUPPORT || (double)out_size * (2 * ceiled + 1) > (double)(PY_SSIZE_T_MAX / 8)) {
        PyErr_SetString(PyExc_ValueError, "resample too large");
        return NULL;
    }
    int ksize = (int)ceiled * 2 + 1;
    PyObject *weights = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)out_size * ksize * sizeof(int32_t));
    PyObject *bounds = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)out_size * 2 * sizeof(int32_t));
    double *k = PyMem_Malloc(sizeof(double) * ksize);
    if (!weights || !bounds || !k) {
        Py_XDECREF(weights);
        Py_XDECREF(bounds);
        PyMem_Free(k);
        return PyErr_NoMemory();
    }
    int32_t *w = (int32_t *)PyBytes_AS_STRING(weights);
    int32_t *b = (int32_t *)PyBytes_AS_STRING(bounds);
    memset(w, 0, (size_t)out_size * ksize * sizeof(int32_t));
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double total = 0.0;
        int first = (int)(center - support + 0.5);
        int last = (int)(center + support + 0.5);
        if (first < 0) {
            first = 0;
        }
        if (last > in_size) {
            last = in_size;
        }
        int count = last - first;
        for (int x = 0; x < count; x++) {
            k[x] = lanczos3((x + first - center + 0.5) * inverse);
            total += k[x];
        }
        if (total != 0.0) {
            for (int x = 0; x < count; x++) {
                k[x] /= total;
            }
        }
        for (int x = 0; x < count; x++) {
            w[(size_t)xx * ksize + x] = k[x] < 0 ? (int32_t)(-0.5 + k[x] * (1 << PRECISION_BITS))
                                                 : (int32_t)(0.5 + k[x] * (1 << PRECISION_BITS));
        }
        b[2 * xx] = first;
        b[2 * xx + 1] = count < 0 ? 0 : count;
    }
    PyMem_Free(k);
    return Py_BuildValue("(NNi)", weights, bounds, ksize);
}

#define BLOCK3 8  /* rows a column holds in the RGB horizontal pass: 24 samples */
#define BLOCK1 32 /* in the L one: 32 samples */

/* One block of rows (at most `block`) of the horizontal pass; `columns` holds in_w columns of block*bands bytes. */
#define HORIZONTAL_BLOCK(NAME, BANDS, BLOCK)                                                                       \
    VECTORISED static void NAME(const uint8_t *src, int in_w, int rows, uint8_t *dst, int out_w, int ksize,      \
                                const int32_t *w, const int32_t *b, uint8_t *columns) {                           \
        enum { LANES = (BANDS) * (BLOCK) };                                                                      \
        memset(columns, 0, (size_t)in_w * LANES);                                                                \
        for (int r = 0; r < rows; r++) {                                                                         \
            const uint8_t *line = src + (size_t)r * in_w * (BANDS);                                             \
            for (int x = 0; x < in_w; x++) {                                                                     \
                for (int c = 0; c < (BANDS); c++) {                                                              \
                    columns[(size_t)x * LANES + r * (BANDS) + c] = line[x * (BANDS) + c];                        \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (int xx = 0; xx < out_w; xx++) {                                                                     \
            int32_t sum[LANES];                                                                                  \
            for (int j = 0; j < LANES; j++) {                                                                    \
                sum[j] = 1 << (PRECISION_BITS - 1);                                                              \
            }                                                                                                    \
            const int32_t *k = w + (size_t)xx * ksize;                                                           \
            const uint8_t *column = columns + (size_t)b[2 * xx] * LANES;                                         \
            for (int t = 0; t < b[2 * xx + 1]; t++, column += LANES) {                                           \
                int32_t weight = k[t];                                                                           \
                for (int j = 0; j < LANES; j++) {                                                                \
                    sum[j] += column[j] * weight;                                                                \
                }                                                                                                \
            }                                                                                                    \
            for (int r = 0; r < rows; r++) {                                                                     \
                uint8_t *out = dst + ((size_t)r * out_w + xx) * (BANDS);                                         \
                for (int c = 0; c < (BANDS); c++) {                                                              \
                    out[c] = to_byte(sum[r * (BANDS) + c]);                                                      \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }

HORIZONTAL_BLOCK(horizontal_block3, 3, BLOCK3)
HORIZONTAL_BLOCK(horizontal_block1, 1, BLOCK1)

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define AVX2_BLOCKS 1

/* The same block in AVX2 by hand: gcc's vectoriser kept the sums of the macro's loop on the stack and widened the
 * samples lane by lane. Here a column's sums stay in registers across its taps (one vector of eight 32-bit sums per
 * eight samples, each widened from eight bytes by one instruction), and they are rounded eight at a time. The rows
 * are copied into the columns pixel by pixel (x outer, so the columns are written in order). */
#define HORIZONTAL_BLOCK_AVX2(NAME, BANDS, BLOCK)                                                                  \
    __attribute__((target("avx2"))) static void NAME(const uint8_t *src, int in_w, int rows, uint8_t *dst,        \
                                                     int out_w, int ksize, const int32_t *w, const int32_t *b,    \
                                                     uint8_t *columns) {                                          \
        enum { LANES = (BANDS) * (BLOCK), VECTORS = LANES / 8 };                                                 \
        const size_t line = (size_t)in_w * (BANDS);                                                              \
        if (rows < (BLOCK)) {                                                                                    \
            memset(columns, 0, (size_t)in_w * LANES);                                                            \
        }                                                                                                        \
        for (int x = 0; x < in_w; x++) {                                                                         \
            uint8_t *column = columns + (size_t)x * LANES;                                                       \
            const uint8_t *pixel = src + (size_t)x * (BANDS);                                                    \
            for (int r = 0; r < rows; r++) {                                                                     \
                memcpy(column + r * (BANDS), pixel + r * line, (BANDS));                                         \
            }                                                                                                    \
        }                                                                                                        \
        /* byte 0 of each 32-bit sum, in each 128-bit half; then the two halves' four bytes side by side */     \
        const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  \
                                                   0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1); \
        const __m256i halves = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);                                       \
        const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);                             \
        for (int xx = 0; xx < out_w; xx++) {                                                                     \
            __m256i sum[VECTORS];                                                                                \
            for (int j = 0; j < VECTORS; j++) {                                                                  \
                sum[j] = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));                                           \
            }                                                                                                    \
            const int32_t *k = w + (size_t)xx * ksize;                                                           \
            const uint8_t *column = columns + (size_t)b[2 * xx] * LANES;                                         \
            for (int t = 0; t < b[2 * xx + 1]; t++, column += LANES) {                                           \
                __m256i weight = _mm256_set1_epi32(k[t]);                                                        \
                for (int j = 0; j < VECTORS; j++) {                                                              \
                    __m256i samples = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(column + 8 * j)));  \
                    sum[j] = _mm256_add_epi32(sum[j], _mm256_mullo_epi32(samples, weight));                       \
                }                                                                                                \
            }                                                                                                    \
            uint8_t rounded[LANES];                                                                              \
            for (int j = 0; j < VECTORS; j++) {                                                                  \
                __m256i v = _mm256_srai_epi32(sum[j], PRECISION_BITS);                                           \
                v = _mm256_min_epi32(_mm256_max_epi32(v, zero), top);                                            \
                v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, low_bytes), halves);                      \
                _mm_storel_epi64((__m128i *)(rounded + 8 * j), _mm256_castsi256_si128(v));                       \
            }                                                                                                    \
            for (int r = 0; r < rows; r++) {                                                                     \
                memcpy(dst + ((size_t)r * out_w + xx) * (BANDS), rounded + r * (BANDS), (BANDS));                \
            }                                                                                                    \
        }                                                                                                        \
    }

HORIZONTAL_BLOCK_AVX2(horizontal_block3_avx2, 3, BLOCK3)
HORIZONTAL_BLOCK_AVX2(horizontal_block1_avx2, 1, BLOCK1)
#endif

VECTORISED static void vertical_rows(const uint8_t *src, size_t line, int first, uint8_t *dst, int out_h, int ksize,
                                     const int32_t *w, const int32_t *b, int32_t *sum) {
    for (int yy = 0; yy < out_h; yy++) {
        const int32_t *k = w + (size_t)yy * ksize;
        for (size_t x = 0; x < line; x++) {
            sum[x] = 1 << (PRECISION_BITS - 1);
        }
        for (int t = 0; t < b[2 * yy + 1]; t++) {
            const uint8_t *row = src + (size_t)(b[2 * yy] - first + t) * line;
            int32_t weight = k[t];
            for (size_t x = 0; x < line; x++) {
                sum[x] += row[x] * weight;
            }
        }
        uint8_t *out = dst + (size_t)yy * line;
        for (size_t x = 0; x < line; x++) {
            out[x] = to_byte(sum[x]);
        }
    }
}

/* The tables, copied into memory of the module's own and checked there: the bounds must lie in [low, high) of the
 * input. The pass reads them without the GIL, so it must read what was checked: a caller's buffer could be
 * rewritten by another thread meanwhile, or be the output buffer itself, which the pass writes. NULL with an
 * exception set if they do not fit; the caller frees the copy (PyMem_RawFree). */
static int32_t *copied_tables(Py_buffer *weights, Py_buffer *bounds, int out_size, int ksize, int low, int high,
                              const int32_t **w, const int32_t **b) {
    if (ksize < 1 || out_size < 1 || out_size >= MAX_SIDE || weights->len != (Py_ssize_t)out_size * ksize * (Py_ssize_t)sizeof(int32_t) ||
        bounds->len != (Py_ssize_t)out_size * 2 * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "tables do not match the output size");
        return NULL;
    }
    int32_t *copy = PyMem_RawMalloc((size_t)weights->len + (size_t)bounds->len);
    if (!copy) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(copy, weights->buf, (size_t)weights->len);
    int32_t *bc = copy + (size_t)out_size * ksize;
    memcpy(bc, bounds->buf, (size_t)bounds->len);
    for (int i = 0; i < out_size; i++) {
        if (bc[2 * i + 1] < 0 || bc[2 * i + 1] > ksize || bc[2 * i] < low ||
            (bc[2 * i + 1] > 0 && (int64_t)bc[2 * i] + bc[2 * i + 1] > high)) {
            PyMem_RawFree(copy);
            PyErr_SetString(PyExc_ValueError, "bounds outside the input");
            return NULL;
        }
    }
    *w = copy;
    *b = bc;
    return copy;
}

/* horizontal(src, in_w, bands, dst, out_w, weights, bounds, ksize[, simd]): every row of src (packed, 1 or 3 bands);
 * simd=False makes the portable copy do it where AVX2 would (a test compares the two) */
static PyObject *horizontal(PyObject *self, PyObject *args) {
    Py_buffer src, dst, weights, bounds;
    int in_w, bands, out_w, ksize, simd = 1;
    if (!PyArg_ParseTuple(args, "y*iiw*iy*y*i|p", &src, &in_w, &bands, &dst, &out_w, &weights, &bounds, &ksize,
                          &simd)) {
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *columns = NULL;
    int32_t *tables = NULL;
    const int32_t *w = NULL, *b = NULL;
    int block = bands == 3 ? BLOCK3 : BLOCK1;
    Py_ssize_t line = (Py_ssize_t)in_w * bands;
    Py_ssize_t rows = line > 0 ? src.len / line : 0;
    if ((bands != 1 && bands != 3) || in_w < 1 || out_w < 1 || rows < 1 || in_w >= MAX_SIDE || rows >= MAX_SIDE ||
        src.len % line != 0 || (Py_ssize_t)out_w * bands > PY_SSIZE_T_MAX / rows ||
        dst.len != rows * out_w * bands) {
        PyErr_SetString(PyExc_ValueError, "buffers do not match the sizes");
        goto done;
    }
    tables = copied_tables(&weights, &bounds, out_w, ksize, 0, in_w, &w, &b);
    if (!tables) {
        goto done;
    }
    columns = PyMem_RawMalloc((size_t)in_w * bands * block);
    if (!columns) {
        PyErr_NoMemory();
        goto done;
    }
#ifdef AVX2_BLOCKS
    const int avx2 = simd && __builtin_cpu_supports("avx2");
#endif
    Py_BEGIN_ALLOW_THREADS
    for (int top = 0; top < rows; top += block) {
        int n = rows - top < block ? rows - top : block;
        const uint8_t *in = (const uint8_t *)src.buf + (size_t)top * line;
        uint8_t *out = (uint8_t *)dst.buf + (size_t)top * out_w * bands;
#ifdef AVX2_BLOCKS
        if (avx2) {
            (bands == 3 ? horizontal_block3_avx2 : horizontal_block1_avx2)(in, in_w, n, out, out_w, ksize, w, b,
                                                                         columns);
            continue;
        }
#endif
        (bands == 3 ? horizontal_block3 : horizontal_block1)(in, in_w, n, out, out_w, ksize, w, b, columns);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_RawFree(columns);
    PyMem_RawFree(tables);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&weights);
    PyBuffer_Release(&bounds);
    return result;
}

/* vertical(src, line, first, dst, out_h, weights, bounds, ksize): src holds input rows first.. of `line` bytes */
static PyObject *vertical(PyObject *self, PyObject *args) {
    Py_buffer src, dst, weights, bounds;
    Py_ssize_t line;
    int first, out_h, ksize;
    if (!PyArg_ParseTuple(args, "y*niw*iy*y*i", &src, &line, &first, &dst, &out_h, &weights, &bounds, &ksize)) {
        return NULL;
    }
    PyObject *result = NULL;
    int32_t *sum = NULL, *tables = NULL;
    const int32_t *w = NULL, *b = NULL;
    if (line < 1 || out_h < 1 || src.len < line || src.len % line != 0 || src.len / line >= MAX_SIDE ||
        line > PY_SSIZE_T_MAX / out_h || (size_t)line > SIZE_MAX / sizeof(int32_t) || dst.len != line * out_h ||
        first < 0 || (int64_t)first + src.len / line > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "buffers do not match the sizes");
        goto done;
    }
    tables = copied_tables(&weights, &bounds, out_h, ksize, first, first + (int)(src.len / line), &w, &b);
    if (!tables) {
        goto done;
    }
    sum = PyMem_RawMalloc(sizeof(int32_t) * (size_t)line);
    if (!sum) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    vertical_rows(src.buf, (size_t)line, first, dst.buf, out_h, ksize, w, b, sum);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_RawFree(sum);
    PyMem_RawFree(tables);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&weights);
    PyBuffer_Release(&bounds);
    return result;
}

static PyMethodDef methods[] = {
    {"coefficients", coefficients, METH_VARARGS, "Pillow's LANCZOS weights: (weights, bounds, ksize)."},
    {"horizontal", horizontal, METH_VARARGS, "The horizontal pass over every row of a packed buffer."},
    {"vertical", vertical, METH_VARARGS, "The vertical pass of a packed buffer holding rows from `first`."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lanczos", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lanczos(void) { return PyModule_Create(&module); }
