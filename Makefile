# Makefile — builds every shoal binary into build/bin/, unit tests into build/tests/, fuzz
# targets into build/fuzz/.
#
#   make               optimised build (build/)
#   make SAN=1         ASAN + UBSAN build of the same (build-san/)
#   make unit          build and run the C unit tests
#   make fuzz          build libFuzzer targets (clang)
#
# Each src/<part>/main.c is a binary's entry point, linked with src/<part>/*.c and the shared
# code (src/common, src/protocol); unit tests link one archive of every non-main file.

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
# libpq (Debian's libpq-dev) for shoal-invalidator's replication client; its headers live
# under pg_config's include directory, found with pkg-config
PQ_CFLAGS := $(shell pkg-config --cflags libpq 2>/dev/null || echo -I/usr/include/postgresql)
CPPFLAGS += -Isrc -Iinclude -D_GNU_SOURCE $(PQ_CFLAGS)
LDLIBS  := -lxxhash -ljansson -lmicrohttpd -luring -lpq -lz -lpthread -lm
# libcurl is not linked: src/common/httpc.c, the one HTTP client, opens it with dlopen when a
# client is first made, so libcurl and its TLS stack are not loaded into a node that does not
# follow a control plane (resident memory is issue 11's measure). Nothing calls curl_* directly.
# A library is recorded only if the binary uses it.
LDFLAGS += -Wl,--as-needed

ifeq ($(SAN),1)
  BUILD  := build-san
  CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
else
  BUILD  := build
endif

ALL_SRC   := $(shell find src -name '*.c' | sort)
MAIN_SRC  := $(filter %/main.c,$(ALL_SRC))
LIB_SRC   := $(filter-out %/main.c,$(ALL_SRC))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB       := $(BUILD)/libshoal_int.a

# binary name: src/node/main.c -> shoal-node
# ... except the command-line tool: src/cli/main.c -> shoal
BIN_NAMES := $(patsubst shoal-cli,shoal,$(patsubst src/%/main.c,shoal-%,$(MAIN_SRC)))
BINS      := $(BIN_NAMES:%=$(BUILD)/bin/%)

UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)

.PHONY: all unit unit-build fuzz clean
all: $(BINS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) -std=gnu11 -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# A binary links its own part (src/<part>/*.c) and the shared code only, so one part's
# half-finished change never stops another binary from building. The shared code is an archive,
# so a binary takes only the files it uses (the node no HTTP client).
SHARED_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard src/common/*.c src/protocol/*.c))
SHARED     := $(BUILD)/libshoal_shared.a
$(SHARED): $(SHARED_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
part_obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out %/main.c,$(wildcard src/$(1)/*.c)))
.SECONDEXPANSION:
$(BUILD)/bin/shoal-%: $(BUILD)/obj/src/%/main.o $$(call part_obj,$$*) $(SHARED)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bin/shoal: $(BUILD)/obj/src/cli/main.o $(call part_obj,cli) $(SHARED)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# the dashboard's page and script are built into shoal-control (.incbin in dash.c)
$(BUILD)/obj/src/control/dash.o: $(wildcard src/control/www/*)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(LDLIBS)

# deliver_drive: the invalidator's delivery on stdin, for tests/integration/test_deliver.py
unit-build: $(UNIT_BINS) $(BUILD)/tests/deliver_drive
unit: unit-build
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

# libFuzzer needs clang; the fuzz build is separate and always sanitised.
FUZZ_CFLAGS := -O1 -g -fsanitize=fuzzer,address,undefined -std=gnu11 $(CPPFLAGS) $(WARN)
# Fuzz targets exercise parsers, so they link only the protocol and common code, plus the
# router's topology parser and slot code (fuzz_topology) and its node-reply framing and meta
# reply code (fuzz_reply), and shoal-control's model and slot maps (fuzz_control), which depend
# on nothing else, and shoal-invalidator's pgoutput decoder, key templates and rows-to-keys.
FUZZ_LINK := $(wildcard src/protocol/*.c src/common/*.c) src/router/topo.c \
             src/router/replyframe.c src/router/metareply.c src/router/statslist.c \
             src/control/model.c src/control/slotmap.c src/invalidator/pgoutput.c \
             src/invalidator/rows.c src/invalidator/config.c src/node/repl_wire.c
# The shared sources are compiled once (coverage-instrumented, without libFuzzer's main) and
# linked into every target: compiling them again for each of ten targets took most of a minute.
FUZZ_OBJ := $(patsubst %.c,build/fuzz-obj/%.o,$(FUZZ_LINK))
build/fuzz-obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(subst -fsanitize=fuzzer,-fsanitize=fuzzer-no-link,$(FUZZ_CFLAGS)) -MMD -MP -c -o $@ $<
build/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -MF build/fuzz-obj/$*.d -o $@ $< $(FUZZ_OBJ) $(LDLIBS)
.SECONDARY: $(FUZZ_OBJ) # kept: the next fuzz build recompiles only what changed
fuzz: $(FUZZ_BINS)

clean:
	rm -rf build build-san

-include $(shell find $(BUILD)/obj build/fuzz-obj -name '*.d' 2>/dev/null)
