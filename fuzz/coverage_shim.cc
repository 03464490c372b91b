// GCC's -fsanitize-coverage=trace-cmp also traces floating-point
// comparisons, which libFuzzer 14 has no hooks for: these take them and
// ignore them (no fuzzed decoder branches on a float).
extern "C" {
void __sanitizer_cov_trace_cmpf(float, float) {}
void __sanitizer_cov_trace_cmpd(double, double) {}
}
