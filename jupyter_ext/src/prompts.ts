// The cells' debugger input boxes that the kernel no longer reads. When the panel (or `xmesh
// debug`) takes the debugger over from a waiting cell, the kernel says so in that cell, but the
// front end keeps the `xmesh_dbg>` box it was given (Jupyter has no message that withdraws an
// input request). The panel closes such a box as Enter would: the kernel drops that late answer.

/** What the kernel writes in a cell whose input box it no longer reads (_kernel/interpreter.py). */
export const LEFTOVER_MARK = 'input box is no longer read';

const DEBUGGER_PROMPT = /xmesh_dbg>|\(Pdb\)/;
const notesSeen = new WeakMap<Element, number>();

function count(text: string, mark: string): number {
  return text.split(mark).length - 1;
}

/** Closes the debugger input boxes of each output area whose kernel said (since the last look)
 * that it no longer reads them. Only boxes there when the note came: the prompt the cell opens
 * again when the panel hands the debugger back is a new box, after a later note count. */
export function closeLeftoverPrompts(root: ParentNode = document): number {
  let closed = 0;
  for (const area of Array.from(root.querySelectorAll('.jp-OutputArea'))) {
    const notes = count(area.textContent ?? '', LEFTOVER_MARK);
    const seen = notesSeen.get(area) ?? 0;
    notesSeen.set(area, notes);
    if (notes <= seen) {
      continue;
    }
    for (const input of Array.from(area.querySelectorAll<HTMLInputElement>('input.jp-Stdin-input'))) {
      const prompt = input.closest('.jp-Stdin')?.querySelector('.jp-Stdin-prompt')?.textContent ?? '';
      if (DEBUGGER_PROMPT.test(prompt)) {
        input.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true }));
        closed++;
      }
    }
  }
  return closed;
}
