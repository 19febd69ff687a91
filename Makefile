# granary build. `make` builds libgranary (static + shared) and build/granary.
# `make test` runs every test; `make SANITIZER=address|thread` builds into its own folder.
# Parts are discovered: every src/<part>/*.c goes into libgranary, except src/cli.

CC      ?= cc
SANITIZER ?=
OPT     ?= -O3
BUILD   := build$(if $(SANITIZER),/$(SANITIZER))

CPPFLAGS := -Iinclude -Isrc -I. -D_GNU_SOURCE -DGR_BUILDING
CFLAGS  := -std=c11 $(OPT) -g -Wall -Wextra -Werror -fPIC -fvisibility=hidden -pthread \
           -fno-strict-aliasing -MMD -MP
LDLIBS  := -lcjson -lxxhash -lopenblas -lzstd -lcrypto -levent_core -levent_pthreads -lmicrohttpd \
           -lzookeeper_mt -lsqlite3 -lm -lpthread
TESTLIBS := -lcmocka

ifeq ($(SANITIZER),address)
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
else ifeq ($(SANITIZER),thread)
  CFLAGS  += -fsanitize=thread -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=thread
else ifneq ($(SANITIZER),)
  $(error SANITIZER must be address or thread)
endif

LIB_SRC  := $(filter-out src/cli/%,$(wildcard src/*/*.c))
CLI_SRC  := $(wildcard src/cli/*.c)
BENCH_SRC := $(wildcard bench/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o) $(BENCH_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_SRC := $(wildcard tests/unit/*/test_*.c)
INTEG_SRC := $(wildcard tests/integration/test_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(UNIT_SRC) $(INTEG_SRC))
TEST_HELPERS := $(wildcard tests/support/*.c)
TEST_HELPER_OBJ := $(TEST_HELPERS:%.c=$(BUILD)/obj/%.o)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)

# Test helper objects are only named in a pattern rule; keep make from deleting them.
.SECONDARY: $(TEST_HELPER_OBJ)

STATIC := $(BUILD)/libgranary.a
SHARED := $(BUILD)/libgranary.so
PROG   := $(BUILD)/granary

.PHONY: all lib test unit-tests demo clean fuzz fuzz-replay setup tests check-deps python
all: $(STATIC) $(SHARED) $(PROG) tests

lib: $(STATIC) $(SHARED)
tests: $(TEST_BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# The dashboard page is built into the program (.incbin in page.c).
$(BUILD)/obj/src/platform/page.o: src/platform/web/index.html
build/fuzz/obj/src/platform/page.o: src/platform/web/index.html

$(STATIC): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(SHARED): $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(PROG): $(CLI_OBJ) $(STATIC)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(STATIC) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(STATIC) $(TEST_HELPER_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(LDFLAGS) -o $@ $< $(TEST_HELPER_OBJ) $(STATIC) $(TESTLIBS) $(LDLIBS)

# src/cli is not in libgranary: its unit tests link the cli objects (all but main).
CLI_TEST_OBJ := $(filter-out %/main.o,$(CLI_OBJ))
$(BUILD)/tests/unit/cli/%: tests/unit/cli/%.c $(STATIC) $(TEST_HELPER_OBJ) $(CLI_TEST_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(LDFLAGS) -o $@ $< $(CLI_TEST_OBJ) $(TEST_HELPER_OBJ) $(STATIC) $(TESTLIBS) $(LDLIBS)

# The Python extension and the PyTorch module (docs/python.md): $(BUILD)/python/granary is an
# importable package (PYTHONPATH=$(BUILD)/python), built against Debian's python3-dev and
# linked with this build's libgranary.a (so SANITIZER=address gives an ASan extension).
PYTHON  ?= /usr/bin/python3
PY_SRC  := $(wildcard python/src/*.c)
PY_OBJ  := $(PY_SRC:%.c=$(BUILD)/obj/%.o)
PY_PKG  := $(patsubst python/%,$(BUILD)/python/%,$(wildcard python/granary/*.py))
PY_EXT  := $(BUILD)/python/granary/_granary.so
PY_TESTS := $(wildcard tests/python/test_*.py)
python: $(PY_EXT) $(PY_PKG)
$(BUILD)/obj/python/src/%.o: python/src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(shell $(PYTHON)-config --includes) $(CFLAGS) -c $< -o $@
$(PY_EXT): $(PY_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -shared $(LDFLAGS) -o $@ $(PY_OBJ) $(STATIC) $(LDLIBS)
$(BUILD)/python/granary/%.py: python/granary/%.py
	@mkdir -p $(dir $@)
	cp $< $@

# The two README commands install what they need first.
setup:
	@bash scripts/setup

# Unit + integration tests; prints a final "N passed, N failed" line.
# The Python tests (tests/python) run too, except under ThreadSanitizer.
test: setup
	@$(MAKE) --no-print-directory all python
	@bash scripts/run-tests $(BUILD) $(TEST_BIN) $(if $(filter thread,$(SANITIZER)),,$(PY_TESTS))

# Includes between parts must follow the table in docs/architecture.md (make test runs it too,
# through tests/integration/test_check_deps.c).
check-deps:
	@python3 scripts/check-deps

demo: setup
	@$(MAKE) --no-print-directory all
	@bash scripts/demo $(BUILD)

# libFuzzer targets (clang). `make fuzz` builds them; `make fuzz-replay` replays each corpus.
# The library is compiled once with the fuzz instrumentation into build/fuzz/obj.
FUZZ_BIN := $(patsubst tests/fuzz/%.c,build/fuzz/%,$(FUZZ_SRC))
FUZZ_CFLAGS := -std=c11 -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fvisibility=hidden -pthread
FUZZ_OBJ := $(LIB_SRC:%.c=build/fuzz/obj/%.o)
.SECONDARY: $(FUZZ_OBJ)
build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(CPPFLAGS) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
build/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	clang $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJ) $(LDLIBS)
fuzz: $(FUZZ_BIN)
fuzz-replay: fuzz
	@bash scripts/fuzz-replay $(FUZZ_BIN)

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
-include $(shell find build/fuzz/obj -name '*.d' 2>/dev/null)
