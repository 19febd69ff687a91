/* The dashboard page, src/platform/web/index.html, built into the program so a controller
 * needs no files beside it (the Makefile makes this object depend on the page). */
#include "platform/platform_int.h"

__asm__(".section .rodata\n"
        ".global gr_dashboard_html\n"
        ".hidden gr_dashboard_html\n"
        ".type gr_dashboard_html, @object\n"
        "gr_dashboard_html:\n"
        ".incbin \"src/platform/web/index.html\"\n"
        ".byte 0\n"
        ".size gr_dashboard_html, . - gr_dashboard_html\n"
        ".previous\n");
