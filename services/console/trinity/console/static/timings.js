// Performance marks the browser tests read (window.trinityConsole.timings): how long the page took to show its
// first view, and how long each live run event took to reach a chart.

export const timings = {
  firstViewMs: null, // performance.now() when the first view had its data on screen (0 = navigation start)
  updates: [], // one per live chart event: {kind, renderMs (SSE message -> chart drawn), endToEndMs (event -> drawn)}
};
window.trinityConsole = { timings };

const openedUnixMs = Date.now();

export function viewReady(name) {
  performance.mark(`console:${name}-ready`);
  if (timings.firstViewMs === null) timings.firstViewMs = performance.now();
}

/** Record one event drawn: `receivedAt` is performance.now() when its SSE message arrived. */
export function chartUpdated(event, receivedAt) {
  const drawnAt = performance.now();
  // Events replayed from before the page opened would count their age, not the console's latency.
  if (event.unix_ms < openedUnixMs) return;
  timings.updates.push({ kind: event.kind, renderMs: drawnAt - receivedAt, endToEndMs: Date.now() - event.unix_ms });
}
