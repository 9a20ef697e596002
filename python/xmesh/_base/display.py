"""Rich display of meshes: one HTML table shape for ProcMesh, ActorMesh and ValueMesh (the
notebook shows it; consoles use the plain repr). Long meshes show their first rows and say
how many were left out."""
import html

MAX_ROWS = 64


def html_table(title, headers, rows, note="", left=()):
    """title: HTML (already escaped); headers: plain strings; rows: lists of plain values.
    left: indexes of columns aligned left (names, paths; notebooks align cells right)."""
    def cell(tag, i, value):
        style = ' style="text-align: left"' if i in left else ""
        return f"<{tag}{style}>{html.escape(str(value))}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = []
    for row in rows[:MAX_ROWS]:
        body.append("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>")
    more = len(rows) - MAX_ROWS
    if more > 0:
        body.append(f'<tr><td colspan="{len(headers)}">... {more} more</td></tr>')
    note_html = f"<div>{html.escape(note)}</div>" if note else ""
    return (f"<div class=\"xmesh-mesh\"><b>{title}</b>{note_html}<table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>")


def coords_cells(shape, point):
    return [point[d] for d in shape.labels]
