# Tidemark: the two entry points are `make run` and `make test`.
# Both install what is missing (scripts/install-deps.sh), then build with
# CMake + Ninja. Release builds keep assertions on (no -DNDEBUG).

BUILD      ?= build
TSAN_BUILD ?= build-tsan
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
# How long `make test` fuzzes each target; `make fuzz FUZZ_SECONDS=600` for longer.
FUZZ_SECONDS ?= 15
CMAKE_GEN  := -G Ninja
JOBS       ?= 2

.PHONY: deps build run demo test test-now test-tsan test-kafka-asan test-asan fuzz bench clean format

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake $(CMAKE_GEN) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The main job: the server on the embedded default, until Ctrl-C.
run: build
	bash scripts/serve.sh $(BUILD)/tidemark

# A walk through the command line (shards, appends, reads, compaction, sinks).
demo: build
	bash scripts/demo.sh $(BUILD)/tidemark

# Every test (ctest), then the concurrency-labelled tests under ThreadSanitizer,
# the Kafka tests under AddressSanitizer + UBSan and each fuzz target for
# FUZZ_SECONDS, with a PostgreSQL and an
# S3 server (s3rver) running for the scale-out tests (scripts/test-services.sh
# starts them and stops them afterwards, and sets TIDEMARK_TEST_NO_SKIP: with
# every service there, a test that skips fails).
test: build
	bash scripts/test-services.sh $(MAKE) --no-print-directory test-now

test-now:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900
	$(MAKE) test-tsan
	$(MAKE) test-kafka-asan
	$(MAKE) fuzz

# -LE kafka: ThreadSanitizer cannot run librdkafka's threads (see
# TIDEMARK_KAFKA_TESTS in CMakeLists.txt); test-kafka-asan runs those tests.
test-tsan: deps
	cmake $(CMAKE_GEN) -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTIDEMARK_SANITIZE=thread
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target tsan_tests
	cd $(TSAN_BUILD) && ctest --output-on-failure -L concurrency -LE kafka -j $(JOBS) --timeout 900

# The Kafka tests (label "kafka") under AddressSanitizer + UBSan, which work
# with librdkafka's threads. Only their binaries and what they run are built,
# in test-asan's build directory.
test-kafka-asan: deps
	cmake $(CMAKE_GEN) -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTIDEMARK_SANITIZE=address
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target kafka_tests
	cd $(ASAN_BUILD) && ctest --output-on-failure -L kafka -j $(JOBS) --timeout 1800

# Every test under AddressSanitizer (+ UBSan), with the servers running too;
# not the memory-cap scenarios (ASan's shadow memory would exceed any cap).
test-asan: deps
	cmake $(CMAKE_GEN) -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTIDEMARK_SANITIZE=address
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && bash $(CURDIR)/scripts/test-services.sh ctest --output-on-failure -j $(JOBS) --timeout 1800 -LE scenarios

# Each decoder's fuzz target (fuzz/) for FUZZ_SECONDS, from its seed corpus.
fuzz: deps
	FUZZ_BUILD=$(FUZZ_BUILD) JOBS=$(JOBS) bash scripts/fuzz.sh $(FUZZ_SECONDS)

bench: build
	$(BUILD)/tidemark bench engine

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD) $(TSAN_BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
