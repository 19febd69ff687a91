/* Command-line options declared once (see opts.h): the one parser, range checker, config-file
 * reader and --help writer that every `granary` command uses. */
#include "cli/opts.h"

#include "granary/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int bad(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return GR_CLI_BAD;
}

/* The words of a CHOICE option; returns the index of `word` or -1. */
static int choice_index(const char *choices, const char *word)
{
    size_t wl = strlen(word);
    int idx = 0;
    for (const char *c = choices; c && *c; idx++) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == wl && !strncmp(c, word, len)) return idx;
        if (!bar) break;
        c = bar + 1;
    }
    return -1;
}

static void range_text(const gr_cli_opt *o, char *buf, size_t cap)
{
    /* Whole bounds print in full (1..4294967295 and 0..1000000000000000000, never 4.29e+09 or
     * 1e+18: a user copies them); others as short as exact. */
    const char *lf = o->lo == floor(o->lo) && fabs(o->lo) <= 9.3e18 ? "%.0f" : "%.15g";
    const char *hf = o->hi == floor(o->hi) && fabs(o->hi) <= 9.3e18 ? "%.0f" : "%.15g";
    char lo[40], hi[40];
    snprintf(lo, sizeof lo, lf, o->lo);
    snprintf(hi, sizeof hi, hf, o->hi);
    snprintf(buf, cap, "%s..%s", lo, hi);
}

/* A whole number, the one way every count of every command is read: decimal digits with an
 * optional sign (exact to 2^63), or a decimal number with an exponent and/or one suffix k, M,
 * G, T (x 1000 each: counts are not bytes, see GR_CLI_SIZE) whose value is whole: 10k, 2.5M,
 * 1e6. Those go through a double, so they are exact below 2^53 and refused above it. */
static int parse_int(const char *s, int64_t *out)
{
    if (!*s || (*s != '-' && *s != '+' && (*s < '0' || *s > '9'))) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end != s && !*end) {
        if (errno) return -1;
        *out = v;
        return 0;
    }
    /* Only digits, one '.', an exponent and a suffix: strtod alone would take "0x1p4",
     * "infinity" or "nan". */
    size_t len = strlen(s);
    double mul = 1;
    switch (s[len - 1]) {
    case 'k': case 'K': mul = 1e3; break;
    case 'M': mul = 1e6; break;
    case 'G': mul = 1e9; break;
    case 'T': mul = 1e12; break;
    default: break;
    }
    size_t numlen = mul > 1 ? len - 1 : len;
    for (size_t i = 0; i < numlen; i++)
        if (!strchr("0123456789.eE+-", s[i])) return -1;
    char num[64];
    if (numlen == 0 || numlen >= sizeof num) return -1;
    memcpy(num, s, numlen);
    num[numlen] = '\0';
    errno = 0;
    double d = strtod(num, &end);
    if (errno || *end || end == num || !isfinite(d)) return -1;
    d *= mul;
    if (d != floor(d) || fabs(d) > 9007199254740992.0) return -1;
    *out = (int64_t)d;
    return 0;
}

static int parse_num(const char *s, double *out)
{
    if (!*s || *s == ' ' || *s == '\t') return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static const char *display_flag(const gr_cli_opt *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "--%s", o->name);
    return buf;
}

int gr_cli_set_text(const gr_cli_opt *o, const char *text, gr_cli_value *v, char *err,
                    size_t errcap)
{
    char flag[80], range[96];
    display_flag(o, flag, sizeof flag);
    range_text(o, range, sizeof range);
    switch (o->type) {
    case GR_CLI_FLAG:
        if (!strcmp(text, "true") || !strcmp(text, "1")) v->b = true;
        else if (!strcmp(text, "false") || !strcmp(text, "0")) v->b = false;
        else return bad(err, errcap, "%s takes no value, got '%s'", flag, text);
        break;
    case GR_CLI_STR:
        v->s = text;
        break;
    case GR_CLI_INT: {
        int64_t x;
        if (parse_int(text, &x))
            return bad(err, errcap, "%s wants a whole number in %s (like 5000, 5k, 2.5M or 1e6), "
                       "got '%s'", flag, range, text);
        if ((double)x < o->lo || (double)x > o->hi)
            return bad(err, errcap, "%s must be in %s, got %s", flag, range, text);
        v->i = x;
        break;
    }
    case GR_CLI_NUM: {
        double x;
        if (parse_num(text, &x))
            return bad(err, errcap, "%s wants a number in %s, got '%s'", flag, range, text);
        if (x < o->lo || x > o->hi)
            return bad(err, errcap, "%s must be in %s, got %s", flag, range, text);
        v->d = x;
        break;
    }
    case GR_CLI_SIZE: {
        uint64_t x;
        /* gr_parse_size reads with strtoull, which would wrap "-1" to 2^64-1. */
        if (strchr(text, '-') || gr_parse_size(text, &x))
            return bad(err, errcap,
                       "%s wants a size like 64, 4k, 10M or 2G (powers of 1024) in %s, got '%s'",
                       flag, range, text);
        if ((double)x < o->lo || (double)x > o->hi)
            return bad(err, errcap, "%s must be in %s, got %s", flag, range, text);
        v->u = x;
        break;
    }
    case GR_CLI_CHOICE: {
        int idx = choice_index(o->choices, text);
        if (idx < 0)
            return bad(err, errcap, "%s wants one of %s, got '%s'", flag, o->choices, text);
        v->i = idx;
        v->s = text;
        break;
    }
    }
    return GR_CLI_OK;
}

/* A config value: the same checks as a flag, from the JSON type the option takes. */
static int set_json(const gr_cli_opt *o, const char *where, const cJSON *it, gr_cli_value *v,
                    char *err, size_t cap)
{
    char num[64], sub[400];
    const char *text = NULL;
    switch (o->type) {
    case GR_CLI_FLAG:
        if (!cJSON_IsBool(it)) return bad(err, cap, "%s: \"%s\" must be true or false", where, it->string);
        v->b = cJSON_IsTrue(it);
        return GR_CLI_OK;
    case GR_CLI_STR:
    case GR_CLI_CHOICE:
        if (!cJSON_IsString(it)) return bad(err, cap, "%s: \"%s\" must be a string", where, it->string);
        text = it->valuestring;
        break;
    case GR_CLI_SIZE:
        if (cJSON_IsString(it)) {
            text = it->valuestring;
            break;
        }
        /* Otherwise a plain number of bytes. */
        /* fall through */
    case GR_CLI_INT:
    case GR_CLI_NUM:
        if (!cJSON_IsNumber(it)) return bad(err, cap, "%s: \"%s\" must be a number", where, it->string);
        if (o->type != GR_CLI_NUM && (it->valuedouble != floor(it->valuedouble) ||
                                      fabs(it->valuedouble) > 9007199254740992.0))
            return bad(err, cap, "%s: \"%s\" must be a whole number, got %.17g", where, it->string,
                       it->valuedouble);
        snprintf(num, sizeof num, o->type == GR_CLI_NUM ? "%.17g" : "%.0f", it->valuedouble);
        text = num;
        break;
    }
    if (gr_cli_set_text(o, text, v, sub, sizeof sub))
        return bad(err, cap, "%s: \"%s\": %s", where, it->string, sub);
    return GR_CLI_OK;
}

static int load_config(const gr_cli_spec *spec, gr_cli_value *vals, gr_cli_parsed *p,
                       const bool *on_cmdline)
{
    size_t cap = sizeof p->err;
    if (gr_read_file(p->config_path, &p->config_text, NULL))
        return bad(p->err, cap, "--config: %s", gr_errmsg());
    p->config = cJSON_Parse(p->config_text);
    if (!cJSON_IsObject(p->config))
        return bad(p->err, cap, "--config: %s is not a JSON object", p->config_path);
    const cJSON *obj = p->config;
    char where[300];
    if (*spec->config_section) {
        obj = cJSON_GetObjectItemCaseSensitive(p->config, spec->config_section);
        if (!obj) return GR_CLI_OK;
        if (!cJSON_IsObject(obj))
            return bad(p->err, cap, "--config %s: \"%s\" must be an object", p->config_path,
                       spec->config_section);
        snprintf(where, sizeof where, "--config %s: \"%s\"", p->config_path, spec->config_section);
    } else {
        snprintf(where, sizeof where, "--config %s", p->config_path);
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        const gr_cli_opt *o = NULL;
        for (size_t i = 0; i < spec->n_opts && !o; i++)
            if (spec->opts[i].json_key && !strcmp(spec->opts[i].json_key, it->string))
                o = &spec->opts[i];
        if (!o) return bad(p->err, cap, "%s: unknown option \"%s\" (see granary %s --help)", where,
                           it->string, spec->command);
        if (on_cmdline[o->id]) continue; /* flags win */
        if (set_json(o, where, it, &vals[o->id], p->err, cap)) return GR_CLI_BAD;
        vals[o->id].given = true;
    }
    return GR_CLI_OK;
}

static const gr_cli_opt *find_flag(const gr_cli_spec *spec, const char *name, size_t len)
{
    for (size_t i = 0; i < spec->n_opts; i++)
        if (strlen(spec->opts[i].name) == len && !strncmp(spec->opts[i].name, name, len))
            return &spec->opts[i];
    return NULL;
}

/* Sets every option to its declared default (given stays false). A default that does not
 * parse is a bug in the table, reported like bad input so a test catches it. */
static int apply_defaults(const gr_cli_spec *spec, gr_cli_value *vals, gr_cli_parsed *p)
{
    for (size_t i = 0; i < spec->n_opts; i++) {
        const gr_cli_opt *o = &spec->opts[i];
        if (o->id != (int)i)
            return bad(p->err, sizeof p->err, "option table: --%s is row %zu but has id %d",
                       o->name, i, o->id);
        memset(&vals[i], 0, sizeof vals[i]);
        if (o->def && gr_cli_set_text(o, o->def, &vals[i], p->err, sizeof p->err))
            return GR_CLI_BAD;
    }
    return GR_CLI_OK;
}

/* One pass over argv: flags into vals (marking on_cmdline), --config's path, positionals. */
static int parse_argv(const gr_cli_spec *spec, int argc, char **argv, gr_cli_value *vals,
                      gr_cli_parsed *p, bool *on_cmdline, FILE *out)
{
    size_t cap = sizeof p->err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            gr_cli_help(spec, out);
            return GR_CLI_HELP;
        }
        if (a[0] != '-' || a[1] == '\0') {
            if (p->n_args >= spec->max_args ||
                p->n_args >= sizeof p->args / sizeof p->args[0])
                return bad(p->err, cap, "unexpected argument '%s'", a);
            p->args[p->n_args++] = a;
            continue;
        }
        if (a[1] != '-') return bad(p->err, cap, "unknown option %s", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const char *val = eq ? eq + 1 : NULL;
        if (spec->config_section && len == 6 && !strncmp(name, "config", 6)) {
            if (!val && i + 1 >= argc) return bad(p->err, cap, "--config needs a value (a JSON file)");
            p->config_path = val ? val : argv[++i];
            continue;
        }
        const gr_cli_opt *o = find_flag(spec, name, len);
        if (!o) return bad(p->err, cap, "unknown option --%.*s", (int)len, name);
        if (o->type == GR_CLI_FLAG) {
            vals[o->id].b = true;
            if (val && gr_cli_set_text(o, val, &vals[o->id], p->err, cap)) return GR_CLI_BAD;
        } else {
            if (!val) {
                if (i + 1 >= argc) return bad(p->err, cap, "--%s needs a value", o->name);
                val = argv[++i];
            }
            if (gr_cli_set_text(o, val, &vals[o->id], p->err, cap)) return GR_CLI_BAD;
        }
        vals[o->id].given = true;
        on_cmdline[o->id] = true;
    }
    return GR_CLI_OK;
}

int gr_cli_parse(const gr_cli_spec *spec, int argc, char **argv, gr_cli_value *vals,
                 gr_cli_parsed *p, FILE *out)
{
    memset(p, 0, sizeof *p);
    int rc = apply_defaults(spec, vals, p);
    if (rc) return rc;
    bool *on_cmdline = calloc(spec->n_opts ? spec->n_opts : 1, sizeof *on_cmdline);
    if (!on_cmdline) return bad(p->err, sizeof p->err, "out of memory");
    rc = parse_argv(spec, argc, argv, vals, p, on_cmdline, out ? out : stdout);
    if (rc == GR_CLI_OK && p->config_path) rc = load_config(spec, vals, p, on_cmdline);
    free(on_cmdline);
    return rc;
}

void gr_cli_parsed_fini(gr_cli_parsed *p)
{
    cJSON_Delete(p->config);
    free(p->config_text);
    p->config = NULL;
    p->config_text = NULL;
}

int gr_cli_parse_or_exit(const gr_cli_spec *spec, int argc, char **argv, gr_cli_value *vals,
                         gr_cli_parsed *p)
{
    int rc = gr_cli_parse(spec, argc, argv, vals, p, stdout);
    if (rc == GR_CLI_OK) return -1;
    if (rc == GR_CLI_HELP) return 0;
    fprintf(stderr, "granary %s: %s (see granary %s --help)\n", spec->command, p->err,
            spec->command);
    return 2;
}

static const char *metavar(const gr_cli_opt *o)
{
    if (o->metavar) return o->metavar;
    switch (o->type) {
    case GR_CLI_FLAG: return "";
    case GR_CLI_STR: return "TEXT";
    case GR_CLI_INT: return "N";
    case GR_CLI_NUM: return "X";
    case GR_CLI_SIZE: return "SIZE";
    case GR_CLI_CHOICE: return o->choices;
    }
    return "";
}

void gr_cli_help(const gr_cli_spec *spec, FILE *out)
{
    fprintf(out, "usage: %s\n", spec->synopsis);
    gr_cli_help_options(spec, out);
}

void gr_cli_help_options(const gr_cli_spec *spec, FILE *out)
{
    if (spec->n_opts || spec->config_section) fprintf(out, "options:\n");
    for (size_t i = 0; i < spec->n_opts; i++) {
        const gr_cli_opt *o = &spec->opts[i];
        char head[128];
        const char *mv = metavar(o);
        snprintf(head, sizeof head, "--%s%s%s", o->name, *mv ? " " : "", mv);
        if (strlen(head) > 24) fprintf(out, "  %s\n  %-24s ", head, "");
        else fprintf(out, "  %-24s ", head);
        for (const char *h = o->help; *h; h++) {
            fputc(*h, out);
            if (*h == '\n') fprintf(out, "  %-24s ", "");
        }
        char range[96] = "";
        if (o->type == GR_CLI_INT || o->type == GR_CLI_NUM || o->type == GR_CLI_SIZE)
            range_text(o, range, sizeof range);
        bool any = o->def || *range || o->json_key;
        if (any) fprintf(out, "\n  %-24s (", "");
        const char *sep = "";
        if (o->def) {
            fprintf(out, "default %s", o->def);
            sep = "; ";
        }
        if (*range) {
            fprintf(out, "%s%s", sep, range);
            sep = "; ";
        }
        if (o->json_key) fprintf(out, "%sconfig \"%s\"", sep, o->json_key);
        fprintf(out, "%s\n", any ? ")" : "");
    }
    if (spec->config_section) {
        fprintf(out, "  %-24s JSON object of options by their config key", "--config FILE");
        if (*spec->config_section) fprintf(out, ", under \"%s\"", spec->config_section);
        fprintf(out, ";\n  %-24s flags win over the file\n", "");
    }
    if (spec->epilog) fprintf(out, "%s", spec->epilog);
}
