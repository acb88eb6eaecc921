"""Writes m.cpp: for each form of a NaN-propagating max, a pooling loop, a ReLU and a max reduction."""
V = {
 "v0": "T m = a < b ? b : a; m = b != b ? b : m; return a != a ? a : m;",
 "v1": "return (((a < b) | (b != b)) & (a == a)) ? b : a;",
 "v2": "T m = a < b ? b : a; return ((a != a) | (b != b)) ? a + b : m;",
 "v4": "return (a != a || b != b) ? a + b : (a < b ? b : a);",
 "v5": "bool take_b = (a < b) | (b != b); take_b = take_b & (a == a); return take_b ? b : a;",
 "v6": "T m = a < b ? b : a; return (a != a || b != b) ? a + b : m;",
 "v7": "T m = std::fmax(a, b); return ((a != a) | (b != b)) ? a + b : m;",
}
out = ["#include <cstdint>", "#include <cmath>"]
for name, body in V.items():
    out.append(f"template <class T> static inline T mx_{name}(T a, T b) {{ {body} }}")
    out.append(f'''extern "C" void pool_{name}(const float* __restrict__ ptr0, float* __restrict__ ptr1) {{
    for (int64_t x0_2 = 0; x0_2 < 34; ++x0_2) {{
        for (int64_t x3 = 0; x3 < 17; ++x3) {{
            for (int64_t x1 = 0; x1 < 16; ++x1) {{
                const float tmp2 = mx_{name}(ptr0[((x0_2 * 1088) + (x3 * 32) + x1)], 0.0f);
                const float tmp4 = mx_{name}(ptr0[((x0_2 * 1088) + (x3 * 32) + x1 + 16)], 0.0f);
                const float tmp5 = mx_{name}(tmp2, tmp4);
                const float tmp7 = mx_{name}(ptr0[((x0_2 * 1088) + (x3 * 32) + x1 + 544)], 0.0f);
                const float tmp8 = mx_{name}(tmp5, tmp7);
                const float tmp10 = mx_{name}(ptr0[((x0_2 * 1088) + (x3 * 32) + x1 + 560)], 0.0f);
                const float tmp11 = mx_{name}(tmp8, tmp10);
                ptr1[((x3 * 16) + (x0_2 * 272) + x1)] = tmp11;
            }}
        }}
    }}
}}
extern "C" void relu_{name}(const float* __restrict__ ptr0, float* __restrict__ ptr1, int64_t n) {{
    for (int64_t i = 0; i < n; ++i) ptr1[i] = mx_{name}(ptr0[i], 0.0f);
}}
extern "C" float amax_{name}(const float* __restrict__ ptr0, int64_t n) {{
    float acc = -INFINITY;
    #pragma omp simd reduction(max:acc)
    for (int64_t i = 0; i < n; ++i) acc = mx_{name}(ptr0[i], acc);
    return acc;
}}''')
open("m.cpp", "w").write("\n".join(out) + "\n")
