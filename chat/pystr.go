package chat

import (
	"fmt"
	"strings"
	"time"
	"unicode"
)

// pyIsSpace is str.isspace for one character: Unicode category Zs or
// bidirectional class WS, B or S, which adds the ASCII separators 0x1c-0x1f
// to what unicode.IsSpace accepts.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}

// pyStrip is str.strip/lstrip/rstrip: with no chars it strips whitespace,
// else any of the given characters.
func pyStrip(s string, chars *string, left, right bool) string {
	cut := pyIsSpace
	if chars != nil {
		set := *chars
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s
}

// pySplit is str.split: on runs of whitespace when sep is nil (dropping
// empty fields), else on each sep; at most maxsplit splits when it is >= 0.
func pySplit(s string, sep *string, maxsplit int) ([]string, error) {
	if sep != nil {
		if *sep == "" {
			return nil, fmt.Errorf("empty separator")
		}
		if maxsplit < 0 {
			return strings.Split(s, *sep), nil
		}
		return strings.SplitN(s, *sep, maxsplit+1), nil
	}
	var out []string
	rest := strings.TrimLeftFunc(s, pyIsSpace)
	for rest != "" {
		if maxsplit >= 0 && len(out) == maxsplit {
			out = append(out, rest)
			break
		}
		end := strings.IndexFunc(rest, pyIsSpace)
		if end < 0 {
			out = append(out, rest)
			break
		}
		out = append(out, rest[:end])
		rest = strings.TrimLeftFunc(rest[end:], pyIsSpace)
	}
	return out, nil
}

// pyTitle is str.title: a letter that follows a cased letter is lowered,
// any other letter is title-cased.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		switch {
		case prevCased:
			b.WriteRune(unicode.ToLower(r))
		default:
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
	}
	return b.String()
}

var (
	weekdays = []string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"}
	months   = []string{"January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"}
)

// strftime formats t like Python's datetime.strftime on glibc in the C
// locale, for the naive local time transformers passes (so %z and %Z are
// empty). A '-' flag drops padding, as glibc allows; unknown directives are
// copied through, as glibc does.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		pad := true
		if format[i] == '-' && i+1 < len(format) {
			pad = false
			i++
		}
		num := func(v, width int, fill byte) {
			s := fmt.Sprint(v)
			for pad && len(s) < width {
				s = string(fill) + s
			}
			b.WriteString(s)
		}
		hour12 := t.Hour() % 12
		if hour12 == 0 {
			hour12 = 12
		}
		switch format[i] {
		case 'a':
			b.WriteString(weekdays[t.Weekday()][:3])
		case 'A':
			b.WriteString(weekdays[t.Weekday()])
		case 'b', 'h':
			b.WriteString(months[t.Month()-1][:3])
		case 'B':
			b.WriteString(months[t.Month()-1])
		case 'c':
			b.WriteString(strftime(t, "%a %b %e %H:%M:%S %Y"))
		case 'C':
			num(t.Year()/100, 2, '0')
		case 'd':
			num(t.Day(), 2, '0')
		case 'D', 'x':
			b.WriteString(strftime(t, "%m/%d/%y"))
		case 'e':
			num(t.Day(), 2, ' ')
		case 'f':
			num(t.Nanosecond()/1000, 6, '0')
		case 'F':
			b.WriteString(strftime(t, "%Y-%m-%d"))
		case 'H':
			num(t.Hour(), 2, '0')
		case 'I':
			num(hour12, 2, '0')
		case 'j':
			num(t.YearDay(), 3, '0')
		case 'k':
			num(t.Hour(), 2, ' ')
		case 'l':
			num(hour12, 2, ' ')
		case 'm':
			num(int(t.Month()), 2, '0')
		case 'M':
			num(t.Minute(), 2, '0')
		case 'n':
			b.WriteByte('\n')
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'R':
			b.WriteString(strftime(t, "%H:%M"))
		case 'S':
			num(t.Second(), 2, '0')
		case 't':
			b.WriteByte('\t')
		case 'T', 'X':
			b.WriteString(strftime(t, "%H:%M:%S"))
		case 'u':
			num((int(t.Weekday())+6)%7+1, 1, '0')
		case 'w':
			num(int(t.Weekday()), 1, '0')
		case 'y':
			num(t.Year()%100, 2, '0')
		case 'Y':
			num(t.Year(), 1, '0')
		case 'z', 'Z':
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			if !pad {
				b.WriteByte('-')
			}
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
